// SPDX-License-Identifier: Apache-2.0
// The parallel policies in math_mode::bf16, over loom::local_comm: a pipeline matches one
// process in bf16, and data-parallel ranks asking for different math modes are told apart.
// Both need bf16 on this CPU (on one without it the trainer refuses bf16 before the ranks
// compare their jobs): the binary (test_parallel_bf16) reports Skipped where it is missing.

#include <catch2/catch.hpp>

#include <atomic>
#include <string>

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

TEST_CASE("Ranks asking for different math modes are told apart at construction", "[parallel][bf16]") {
  // bf16 on one rank and fp32 on another would average gradients of different computations.
  std::atomic<int> caught{0};
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
          c, {.lr = 0.02f}, {.seed = 1, .threads = 1, .math = c.rank() == 0 ? loom::math_mode::fp32 : loom::math_mode::bf16}};
    } catch (const loom::communication_error& e) {
      if (std::string(e.what()).find("[math=bf16] where rank 0 has [math=fp32]") != std::string::npos) ++caught;
    }
  });
  CHECK(caught == 2);
}
