// SPDX-License-Identifier: Apache-2.0
// The GPU check compares loom::cuda against a serial host reference; here that reference is
// checked against loom::cpu on the same cases, on any machine: every layer's forward and
// backward within 1e-4, and the 200-step training runs within 1e-3 — the tolerances the GPU
// check and the CUDA tests use, shown reachable by two backends that add in different orders.
// The same in math_mode::bf16, which needs bf16 on this CPU, is reference_bf16_test.cpp.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include "cases.hpp"
#include "random_pass_input.hpp"
#include "reference_backend.hpp"
#include "relative_error.hpp"

using namespace loom;
using namespace loom::cuda_tests;
using loom::gpu_check::reference;
using loom::testing::compare_relative;
using loom::testing::max_abs;

namespace {

template <class Network>
void check_pass(std::size_t batch, std::uint64_t seed) {
  const pass_input in = random_pass_input<Network>(batch, seed);
  const pass_result c = run_pass<Network, loom::cpu>(in);
  const pass_result r = run_pass<Network, reference>(in);
  auto agree = [](const char* what, const std::vector<float>& ref, const std::vector<float>& cpu) {
    const auto e = compare_relative(ref, cpu, 1e-2 * max_abs(std::span<const float>(cpu)));
    INFO(what << ": " << e.str());
    CHECK(e.max_error <= 1e-4);
  };
  agree("output", r.y, c.y);
  agree("input gradient", r.dx, c.dx);
  agree("parameter gradients", r.dparams, c.dparams);
}

}  // namespace

#define LOOM_REFERENCE_TEST_PASS(name)                                                                    \
  TEST_CASE("The GPU check's reference equals cpu on one forward and backward of " #name, "[reference]") { \
    for (std::size_t batch : {1, 7, 32}) {                                                                \
      INFO("batch " << batch);                                                                            \
      check_pass<name>(batch, 100 + batch);                                                               \
    }                                                                                                     \
  }
LOOM_CUDA_TEST_PASS_CASES(LOOM_REFERENCE_TEST_PASS)

TEST_CASE("200 training steps on the reference end within 1e-3 of the cpu run's loss", "[reference][train]") {
  auto check = [](const train_result& r, const train_result& c) {
    INFO("reference: train loss " << r.train_loss << ", eval loss " << r.eval_loss << ", accuracy " << r.eval_accuracy);
    INFO("cpu:       train loss " << c.train_loss << ", eval loss " << c.eval_loss << ", accuracy " << c.eval_accuracy);
    CHECK(r.steps == 200);
    CHECK(std::abs(r.train_loss - c.train_loss) <= 1e-3);
    CHECK(std::abs(r.eval_loss - c.eval_loss) <= 1e-3);
    CHECK(c.eval_loss < 2.0);
  };
  SECTION("mlp") { check(run_training<train_mlp, reference>(200), run_training<train_mlp, loom::cpu>(200)); }
  SECTION("cnn") { check(run_training<train_cnn, reference>(200), run_training<train_cnn, loom::cpu>(200)); }
}
