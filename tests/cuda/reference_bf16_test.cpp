// SPDX-License-Identifier: Apache-2.0
// The GPU check's serial reference against loom::cpu in math_mode::bf16 (see reference_test.cpp
// for fp32). loom::cpu's side needs bf16 on this CPU: the binary (test_cuda_reference_bf16)
// reports Skipped where it is missing.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cases.hpp"
#include "random_pass_input.hpp"
#include "reference_backend.hpp"
#include "relative_error.hpp"

using namespace loom::cuda_tests;
using loom::gpu_check::reference;

namespace {

// In math_mode::bf16 the reference rounds the operands of its products to bf16 and sums in
// double: the definition of what loom::cpu and loom::cuda compute. loom::cpu (oneDNN bf16
// primitives) must match it to float rounding on single layers; through whole networks, where
// a rounding of one intermediate value can land on the other side of a bf16 tie, normwise.
template <class Network>
void check_bf16_pass(std::size_t batch, std::uint64_t seed, double elementwise, double from_fp32) {
  const pass_input in = random_pass_input<Network>(batch, seed, loom::math_mode::bf16);
  const pass_result c = run_pass<Network, loom::cpu>(in);
  const pass_result r = run_pass<Network, reference>(in);
  pass_input fp32 = in;
  fp32.math = loom::math_mode::fp32;
  const pass_result r32 = run_pass<Network, reference>(fp32);
  auto agree = [&](const char* what, const std::vector<float>& ref, const std::vector<float>& cpu,
                   const std::vector<float>& ref32) {
    const double floor = 1e-2 * loom::testing::max_abs(std::span<const float>(cpu));
    const auto e = loom::testing::compare_relative(ref, cpu, floor);
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

}  // namespace

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
