// SPDX-License-Identifier: Apache-2.0
// The parallel policies in math_mode::bf16, over loom::local_comm: a pipeline matches one
// process in bf16. It needs bf16 on this CPU: the binary (test_parallel_bf16) reports Skipped
// where it is missing. (Ranks asking for different math modes are told apart on every CPU —
// the job check comes before the math check — in local_test.cpp.)

#include <catch2/catch.hpp>

#include "pipeline_local.hpp"

using namespace loom_test;

TEST_CASE("Under math_mode::bf16 a pipeline matches one process in bf16", "[parallel][pipeline][bf16]") {
  const auto opts = steps(10, 64);
  const auto ref = reference_with<mlp>(train_set(), opts, nullptr, nullptr, loom::math_mode::bf16);
  const auto out = train_pipeline<mlp, local_pipeline<2, loom::micro_batches<1>>>(2, train_set(), opts, false,
                                                                                 loom::math_mode::bf16);
  CHECK(relative_distance(out.params[0], ref) <= 1e-5);
  // bf16 took effect: fp32 training ends elsewhere.
  CHECK(relative_distance(out.params[0], reference_with<mlp>(train_set(), opts)) > 1e-4);
}
