// SPDX-License-Identifier: Apache-2.0
// loom::cuda against loom::cpu: every layer's forward and backward, whole networks, and 200-step
// training runs agree; the caching allocator reuses blocks; failures of CUDA and cuBLAS calls
// are loom::backend_error naming the call; in bf16 math cuda stays within bf16 tolerance of
// cpu. Both backends run in translation units of their own
// (cpu_side.cpp, cuda_side.cu); this one compares.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cases.hpp"
#include "cuda_side.hpp"
#include "gradient_check.hpp"
#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "relative_error.hpp"

using namespace loom;
using namespace loom::cuda_tests;
using loom::testing::compare_relative;
using loom::testing::max_abs;

namespace {

/// Relative agreement required of float results computed in different orders, against a floor
/// of 1% of the span's largest magnitude (sums that cancel carry float's absolute error).
constexpr double tolerance = 1e-4;
constexpr double floor_fraction = 1e-2;

std::vector<float> as_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

template <class Network>
void check_pass(std::size_t batch, std::uint64_t seed) {
  pass_input in;
  in.batch = batch;
  // Parameters near the initialisation's scale, moved off zero so biases and gains matter.
  in.params = as_floats(loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.01));
  in.x = as_floats(loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0));
  in.dy = as_floats(loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0));
  const pass_result c = run_pass<Network, loom::cpu>(in);
  const pass_result g = run_pass<Network, loom::cuda>(in);
  auto agree = [](const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu) {
    const auto r = compare_relative(gpu, cpu, floor_fraction * max_abs(std::span<const float>(cpu)));
    INFO(what << ": " << r.str());
    CHECK(r.max_error <= tolerance);
  };
  agree("output", g.y, c.y);
  agree("input gradient", g.dx, c.dx);
  agree("parameter gradients", g.dparams, c.dparams);
}

}  // namespace

#define LOOM_CUDA_TEST_PASS(name)                                                                  \
  TEST_CASE("cuda equals cpu on one forward and backward of " #name, "[cuda][agreement]") {        \
    for (std::size_t batch : {1, 7, 32}) {                                                         \
      INFO("batch " << batch);                                                                     \
      check_pass<name>(batch, 100 + batch);                                                        \
    }                                                                                              \
  }
LOOM_CUDA_TEST_PASS_CASES(LOOM_CUDA_TEST_PASS)

TEST_CASE("200 training steps on cuda end within 1e-3 of the cpu run's loss", "[cuda][train]") {
  auto check = [](const train_result& g, const train_result& c) {
    INFO("cuda: train loss " << g.train_loss << ", eval loss " << g.eval_loss << ", accuracy " << g.eval_accuracy);
    INFO("cpu:  train loss " << c.train_loss << ", eval loss " << c.eval_loss << ", accuracy " << c.eval_accuracy);
    CHECK(g.steps == 200);
    CHECK(c.steps == 200);
    CHECK(std::abs(g.train_loss - c.train_loss) <= 1e-3);
    CHECK(std::abs(g.eval_loss - c.eval_loss) <= 1e-3);
    CHECK(g.eval_loss < 2.0);  // it learnt something (chance is log 10 = 2.3)
  };
  SECTION("mlp") { check(run_training<train_mlp, loom::cuda>(200), run_training<train_mlp, loom::cpu>(200)); }
  SECTION("cnn") { check(run_training<train_cnn, loom::cuda>(200), run_training<train_cnn, loom::cpu>(200)); }
}

TEST_CASE("The caching allocator hands a freed block out again instead of calling cudaMalloc", "[cuda][memory]") {
  const auto s0 = cuda_space::allocator_stats();
  void* a = cuda_space::allocate(1000);
  const auto s1 = cuda_space::allocator_stats();
  cuda_space::deallocate(a, 1000);
  void* b = cuda_space::allocate(900);  // the same size class (1024 bytes)
  const auto s2 = cuda_space::allocator_stats();
  CHECK(b == a);
  CHECK(s2.device_allocations == s1.device_allocations);
  CHECK(s2.reuses == s1.reuses + 1);
  CHECK(s1.bytes_in_use == s0.bytes_in_use + 1024);
  cuda_space::deallocate(b, 900);
  CHECK(cuda_space::allocator_stats().bytes_in_use == s0.bytes_in_use);
  {
    buffer<float, cuda_space> x(1 << 20);
  }
  const auto s3 = cuda_space::allocator_stats();
  { buffer<float, cuda_space> y(1 << 20); }
  CHECK(cuda_space::allocator_stats().device_allocations == s3.device_allocations);
  CHECK(detail::cuda_caching_allocator::size_class(1) == 512);
  CHECK(detail::cuda_caching_allocator::size_class(1025) == 1280);
  CHECK(detail::cuda_caching_allocator::size_class(1 << 20) == (1 << 20));
}

TEST_CASE("A failing CUDA call throws backend_error naming the call, file and line", "[cuda][errors]") {
  buffer<float, cuda_space> d(16);
  float h[16] = {};
  CHECK_THROWS_AS(LOOM_CUDA_CHECK(cudaMemcpy(d.data(), h, sizeof h, static_cast<cudaMemcpyKind>(42))), backend_error);
  CHECK_THROWS_WITH(LOOM_CUDA_CHECK(cudaMemcpy(d.data(), h, sizeof h, static_cast<cudaMemcpyKind>(42))),
                    Catch::Contains("cudaMemcpy(d.data(), h, sizeof h") && Catch::Contains("cuda_test.cpp:") &&
                        Catch::Contains("cudaError"));
  // The error is cleared: the next call works.
  CHECK_NOTHROW(LOOM_CUDA_CHECK(cudaMemcpy(d.data(), h, sizeof h, cudaMemcpyHostToDevice)));
  CHECK_THROWS_WITH(gemm_with_a_bad_leading_dimension(),
                    Catch::Contains("cuBLAS") && Catch::Contains("cublasSgemm") && Catch::Contains("gemm.hpp:") &&
                        Catch::Contains("CUBLAS_STATUS_INVALID_VALUE"));
}

TEST_CASE("cuda::sum adds in double and repeats itself exactly", "[cuda][sum]") {
  std::vector<float> v(1'000'003);
  double expected = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>((i % 1000) * 0.001 - 0.4);
    expected += static_cast<double>(v[i]);
  }
  const double a = sum_on_gpu(v), b = sum_on_gpu(v);
  CHECK(a == b);
  CHECK(std::abs(a - expected) <= 1e-9 * std::abs(expected) + 1e-9);
  CHECK(sum_on_gpu({}) == 0.0);
}

namespace {

/// One pass of Network in bf16 on both backends and in fp32 on cuda: cuda's bf16 results stay
/// within bf16 tolerance of the CPU's (both round the products' operands to bf16 alike; cuDNN
/// convolutions run TF32, finer than bf16) and of cuda's fp32 results. `must_differ`: the
/// case's products are all cuBLAS calls, so bf16 must visibly change them. `elementwise` (> 0):
/// the case is one matrix product, whose operands both backends round identically, so they
/// must agree element by element as in fp32. `bound`: how far
/// from cpu bf16 and cuda fp32 the case may go: 1e-2 for one layer; whole networks more, as bf16
/// (and TF32 against bf16) flips some ReLU and max-pool choices and sends gradients elsewhere.
template <class Network>
void check_bf16_pass(std::size_t batch, std::uint64_t seed, bool must_differ, double bound, double elementwise = 0) {
  pass_input in;
  in.batch = batch;
  in.math = loom::math_mode::bf16;
  in.params = as_floats(loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.01));
  in.x = as_floats(loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0));
  in.dy = as_floats(loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0));
  const pass_result c = run_pass<Network, loom::cpu>(in);
  const pass_result g = run_pass<Network, loom::cuda>(in);
  pass_input fp32 = in;
  fp32.math = loom::math_mode::fp32;
  const pass_result g32 = run_pass<Network, loom::cuda>(fp32);
  auto agree = [&](const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu,
                   const std::vector<float>& gpu32) {
    const double to_cpu = loom::testing::normwise_error(gpu, cpu), to_fp32 = loom::testing::normwise_error(gpu, gpu32);
    const auto e = compare_relative(gpu, cpu, floor_fraction * max_abs(std::span<const float>(cpu)));
    INFO(what << ": cuda bf16 vs cpu bf16, normwise " << to_cpu << ", element-wise " << e.str()
              << "; cuda bf16 vs cuda fp32, normwise " << to_fp32);
    if (elementwise > 0) CHECK(e.max_error <= elementwise);
    CHECK(to_cpu <= bound);
    CHECK(to_fp32 <= bound);
    if (must_differ) CHECK(to_fp32 > 1e-4);
  };
  agree("output", g.y, c.y, g32.y);
  agree("input gradient", g.dx, c.dx, g32.dx);
  agree("parameter gradients", g.dparams, c.dparams, g32.dparams);
}

}  // namespace

TEST_CASE("cuda in bf16 stays within bf16 tolerance of cpu in bf16 and of cuda in fp32", "[cuda][bf16]") {
  REQUIRE(cuda_supports_bf16());  // every GPU from compute capability 8.0 on
  for (std::size_t batch : {1, 7, 32}) {
    INFO("batch " << batch);
    check_bf16_pass<linear_case>(batch, 300 + batch, true, 2e-2, tolerance);
    check_bf16_pass<mlp_case>(batch, 350 + batch, true, 0.15);
    check_bf16_pass<conv_case>(batch, 310 + batch, false, 2e-2);
    check_bf16_pass<conv_strided_case>(batch, 320 + batch, false, 2e-2);
    check_bf16_pass<conv_relu_case>(batch, 340 + batch, false, 0.15);
    check_bf16_pass<cnn_case>(batch, 360 + batch, false, 0.15);
  }
}

TEST_CASE("200 bf16 training steps on cuda end within 0.05 of the cpu bf16 run's loss", "[cuda][bf16][train]") {
  REQUIRE(cuda_supports_bf16());
  auto check = [](const train_result& g, const train_result& c) {
    INFO("cuda bf16: train loss " << g.train_loss << ", eval loss " << g.eval_loss << ", accuracy " << g.eval_accuracy);
    INFO("cpu bf16:  train loss " << c.train_loss << ", eval loss " << c.eval_loss << ", accuracy " << c.eval_accuracy);
    CHECK(g.steps == 200);
    CHECK(std::abs(g.train_loss - c.train_loss) <= 0.05);
    CHECK(std::abs(g.eval_loss - c.eval_loss) <= 0.05);
    CHECK(g.eval_loss < 2.0);
  };
  const auto bf16 = loom::math_mode::bf16;
  SECTION("mlp") { check(run_training<train_mlp, loom::cuda>(200, bf16), run_training<train_mlp, loom::cpu>(200, bf16)); }
  SECTION("cnn") { check(run_training<train_cnn, loom::cuda>(200, bf16), run_training<train_cnn, loom::cpu>(200, bf16)); }
}
