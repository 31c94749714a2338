// SPDX-License-Identifier: Apache-2.0
// The GPU check compares loom::cuda against a serial host reference; here that reference is
// checked against loom::cpu on the same cases, on any machine: every layer's forward and
// backward within 1e-4, and the 200-step training runs within 1e-3 — the tolerances the GPU
// check and the CUDA tests use, shown reachable by two backends that add in different orders.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include "cases.hpp"
#include "gradient_check.hpp"
#include "reference_backend.hpp"
#include "relative_error.hpp"

using namespace loom;
using namespace loom::cuda_tests;
using loom::gpu_check::reference;
using loom::testing::compare_relative;
using loom::testing::max_abs;

namespace {

std::vector<float> as_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

template <class Network>
void check_pass(std::size_t batch, std::uint64_t seed) {
  pass_input in;
  in.batch = batch;
  in.params = as_floats(loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.01));
  in.x = as_floats(loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0));
  in.dy = as_floats(loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0));
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

// In math_mode::bf16 the reference rounds the operands of its products to bf16 and sums in
// double: the definition of what loom::cpu and loom::cuda compute. loom::cpu (oneDNN bf16
// primitives) must match it to float rounding on single layers; through whole networks, where
// a rounding of one intermediate value can land on the other side of a bf16 tie, normwise.
template <class Network>
void check_bf16_pass(std::size_t batch, std::uint64_t seed, double elementwise, double from_fp32) {
  pass_input in;
  in.batch = batch;
  in.math = loom::math_mode::bf16;
  in.params = as_floats(loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.01));
  in.x = as_floats(loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0));
  in.dy = as_floats(loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0));
  const pass_result c = run_pass<Network, loom::cpu>(in);
  const pass_result r = run_pass<Network, reference>(in);
  pass_input fp32 = in;
  fp32.math = loom::math_mode::fp32;
  const pass_result r32 = run_pass<Network, reference>(fp32);
  auto agree = [&](const char* what, const std::vector<float>& ref, const std::vector<float>& cpu,
                   const std::vector<float>& ref32) {
    const auto e = compare_relative(ref, cpu, 1e-2 * max_abs(std::span<const float>(cpu)));
    const double n = loom::testing::normwise_error(cpu, ref), to_fp32 = loom::testing::normwise_error(ref, ref32);
    INFO(what << ": element-wise " << e.str() << "; normwise " << n << "; reference bf16 vs fp32, normwise " << to_fp32);
    if (elementwise > 0) CHECK(e.max_error <= elementwise);
    CHECK(n <= 1e-3);
    CHECK(to_fp32 > 1e-4);  // bf16 is not fp32: the check would notice a backend ignoring it
    // Anything with a ReLU or max-pool moves further from fp32 than one product: bf16 flips
    // some of their choices, and the gradient goes elsewhere.
    CHECK(to_fp32 < from_fp32);
  };
  agree("output", r.y, c.y, r32.y);
  agree("input gradient", r.dx, c.dx, r32.dx);
  agree("parameter gradients", r.dparams, c.dparams, r32.dparams);
}

TEST_CASE("In bf16 the GPU check's reference equals cpu on layers with weights and on whole networks",
          "[reference][bf16]") {
  for (std::size_t batch : {1, 7, 32}) {
    INFO("batch " << batch);
    check_bf16_pass<linear_case>(batch, 300 + batch, 1e-4, 2e-2);
    check_bf16_pass<conv_case>(batch, 310 + batch, 1e-4, 2e-2);
    check_bf16_pass<conv_strided_case>(batch, 320 + batch, 1e-4, 2e-2);
    check_bf16_pass<conv_wide_case>(batch, 330 + batch, 1e-4, 2e-2);
    check_bf16_pass<conv_relu_case>(batch, 340 + batch, 1e-4, 0.15);
    check_bf16_pass<mlp_case>(batch, 350 + batch, 0, 0.15);
    check_bf16_pass<cnn_case>(batch, 360 + batch, 0, 0.15);
  }
}
