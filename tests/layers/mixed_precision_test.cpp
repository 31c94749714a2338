// SPDX-License-Identifier: Apache-2.0
// math_mode::bf16 on the CPU: the matrix products and convolutions see bf16-rounded operands and
// sum in float. Checked exactly against double runs of the same layer on operands rounded to
// bf16 beforehand (agreement to float rounding), and against fp32 runs (bf16-sized differences:
// close, but not equal — so bf16 really ran). fp32 runs stay bitwise what they were. Every case
// needs bf16 products on this CPU: the binary (test_layers_bf16) reports Skipped where they are
// missing. The rounding itself, which needs no bf16 hardware, is tested in bf16_rounding_test.cpp.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gradient_check.hpp"
#include "loom/backend/cpu.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/backend/cpu/features.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"
#include "loom/nn/residual_with.hpp"
#include "relative_error.hpp"
#include "two_threads.hpp"

using namespace loom;
using loom::testing::compare_relative;
using loom::testing::max_abs;
using loom::testing::normwise_error;

namespace {

/// Float results of a bf16 run against a double run on bf16-rounded operands: only the order
/// and precision of float accumulation differ.
constexpr double exact_tolerance = 1e-4;
/// bf16 runs against fp32 runs: bf16 keeps 8 significant bits (relative rounding up to 2^-8 = 0.004
/// per operand); sums of many such products land well inside 1e-2.
constexpr double bf16_tolerance = 1e-2;
/// ...and at least this far apart somewhere, or bf16 did not run.
constexpr double bf16_at_least = 1e-4;
constexpr double floor_fraction = 1e-2;

std::vector<double> bf16_rounded(std::vector<double> v) {
  for (double& x : v) x = static_cast<double>(detail::round_to_bf16(static_cast<float>(x)));
  return v;
}
std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Forward and backward of a one-layer Network in float, math `m`, from float parameters p,
/// input x and output gradient dy; returns the output followed by the parameter gradients and
/// the input gradient (the model keeps dx of its first layer only when asked: we run the
/// layer's sequence directly for it).
template <class Network>
struct float_run {
  std::vector<float> y, grads;
};

template <class Network, class T>
float_run<Network> run(math_mode m, const std::vector<T>& p, const std::vector<T>& x, const std::vector<T>& dy,
                       std::size_t batch, bool accumulate_twice = false) {
  model<Network, T> net(1);
  std::copy(p.begin(), p.end(), net.parameters().begin());
  run_context ctx;
  ctx.math = m;
  const T* y = net.forward(ctx, x.data(), batch);
  float_run<Network> r;
  r.y.assign(y, y + batch * Network::output_shape::size);
  net.backward(ctx, dy.data(), batch);
  if (accumulate_twice) {
    ctx.accumulate = true;
    net.forward(ctx, x.data(), batch);
    net.backward(ctx, dy.data(), batch);
  }
  const auto g = net.gradients();
  r.grads.assign(g.begin(), g.end());
  return r;
}

/// The three-way check for a one-layer network: bf16 float run == double run on rounded
/// operands (to float rounding); bf16 run ~ fp32 run (bf16 rounding), and != it.
template <class Network>
void check_layer(std::size_t batch, std::uint64_t seed, bool accumulate_twice = false, bool bias = true) {
  // Parameters, input and output gradient, all float-representable.
  auto p = loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.0);
  for (double& v : p) v = static_cast<double>(static_cast<float>(v));
  auto x = loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0);
  for (double& v : x) v = static_cast<double>(static_cast<float>(v));
  auto dy = loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0);
  for (double& v : dy) v = static_cast<double>(static_cast<float>(v));

  const auto bf = run<Network, float>(math_mode::bf16, to_float(p), to_float(x), to_float(dy), batch, accumulate_twice);
  const auto fp = run<Network, float>(math_mode::fp32, to_float(p), to_float(x), to_float(dy), batch, accumulate_twice);
  // The reference: weights rounded to bf16 (biases enter by addition, in float: not rounded).
  auto p_rounded = p;
  const std::size_t weights = Network::parameter_count - (bias ? Network::output_shape::dims[0] : 0);
  for (std::size_t i = 0; i < weights; ++i) p_rounded[i] = static_cast<double>(detail::round_to_bf16(static_cast<float>(p[i])));
  const auto ref = run<Network, double>(math_mode::fp32, p_rounded, bf16_rounded(x), bf16_rounded(dy), batch, accumulate_twice);

  auto expect = [&](const char* what, const std::vector<float>& bf16, const std::vector<float>& fp32,
                    const std::vector<float>& reference) {
    const double floor = floor_fraction * max_abs(std::span<const float>(reference));
    const auto exact = compare_relative(bf16, reference, floor);
    const double near = normwise_error(bf16, fp32);
    INFO(what << ": bf16 vs double on bf16-rounded operands " << exact.str() << "; bf16 vs fp32, normwise " << near);
    CHECK(max_abs(std::span<const float>(reference)) > 0);
    CHECK(exact.max_error < exact_tolerance);
    CHECK(near < bf16_tolerance);
    CHECK(near > bf16_at_least);
  };
  expect("output", bf.y, fp.y, to_float(std::vector<double>(ref.y.begin(), ref.y.end())));
  const auto part = [](const auto& v, std::size_t from, std::size_t to) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to));
  };
  const std::size_t all = Network::parameter_count;
  expect("weight gradients", part(bf.grads, 0, weights), part(fp.grads, 0, weights), part(ref.grads, 0, weights));
  // Bias gradients are sums of dy: linear adds float dy (an element-wise kernel), oneDNN's
  // bf16 convolution adds the bf16 dy it was given. Either way within bf16 tolerance of fp32.
  if (!bias) return;
  const auto db16 = part(bf.grads, weights, all), db32 = part(fp.grads, weights, all);
  INFO("bias gradients, bf16 vs fp32, normwise: " << normwise_error(db16, db32));
  CHECK(normwise_error(db16, db32) < bf16_tolerance);
}

/// The input gradient of a layer in math m (float): a layer in the middle of a network.
template <class Layer, class In>
std::vector<float> input_gradient(math_mode m, const std::vector<float>& p, const std::vector<float>& x,
                                  const std::vector<float>& dy, std::size_t batch) {
  typename Layer::template impl<In, float, cpu> layer(layer_site{});
  using Out = typename Layer::template output_shape<In>;
  std::vector<float> y(batch * Out::size), dx(batch * In::size), dparams(p.size());
  run_context ctx;
  ctx.math = m;
  activation<float, cpu> ya{y.data()};
  layer.forward(ctx, p.data(), activation<const float, cpu>{x.data()}, ya, batch);
  // dy in the layout the output came in (plain for linear; conv2d may block it).
  std::vector<float> dy_in(dy.size());
  cpu::layout_converter conv;
  conv.template from_plain<float, Out>(dy.data(), ya.format, dy_in.data(), batch);
  layer.backward(ctx, p.data(), activation<const float, cpu>{x.data()}, activation<const float, cpu>{ya.data, ya.format},
                 dy_in.data(), dx.data(), dparams.data(), batch);
  return dx;
}

template <class Layer, class In>
void check_input_gradient(std::size_t batch, std::uint64_t seed) {
  using Out = typename Layer::template output_shape<In>;
  const auto p = to_float(loom::testing::random_values(Layer::template parameter_count<In>, seed, 0.3, 0.0));
  const auto x = to_float(loom::testing::random_values(batch * In::size, seed + 1, 1.0, 0.0));
  const auto dy = to_float(loom::testing::random_values(batch * Out::size, seed + 2, 1.0, 0.0));
  std::vector<float> p16(p), dy16(dy);
  for (float& v : p16) v = detail::round_to_bf16(v);
  for (float& v : dy16) v = detail::round_to_bf16(v);
  const auto bf = input_gradient<Layer, In>(math_mode::bf16, p, x, dy, batch);
  const auto fp = input_gradient<Layer, In>(math_mode::fp32, p, x, dy, batch);
  // fp32 on operands rounded beforehand: the same products as bf16, in float.
  const auto ref = input_gradient<Layer, In>(math_mode::fp32, p16, x, dy16, batch);
  const double floor = floor_fraction * max_abs(std::span<const float>(ref));
  const auto exact = compare_relative(bf, ref, floor);
  const double near = normwise_error(bf, fp);
  INFO("input gradient: bf16 vs fp32 on rounded operands " << exact.str() << "; bf16 vs fp32, normwise " << near);
  CHECK(max_abs(std::span<const float>(ref)) > 0);
  CHECK(exact.max_error < exact_tolerance);
  CHECK(near < bf16_tolerance);
  CHECK(near > bf16_at_least);
}

using one_linear = network<input<300>, linear<70>>;
using one_conv = network<input<3, 12, 12>, conv2d<16, 3, 1, 1>>;
using strided_conv = network<input<8, 9, 9>, conv2d<5, 3, 2, 0>>;
// At most 16 output pixels: the weight gradient as one matmul over x's columns (zeros where the
// padding is), with and without bias, strided.
using small_conv = network<input<32, 4, 4>, conv2d<48, 3, 1, 1, no_bias>>;
using small_strided_conv = network<input<16, 7, 7>, conv2d<32, 3, 2, 1>>;
// At most 4 output pixels: forward and the input gradient as matmuls too.
using tiny_conv = network<input<32, 2, 2>, conv2d<40, 3, 1, 1, no_bias>>;
using tiny_strided_conv = network<input<24, 4, 4>, conv2d<48, 3, 2, 1>>;
using cnn = network<input<1, 28, 28>, conv2d<32, 3, 1, 1>, relu, max_pool2d<2>, conv2d<64, 3, 1, 1>, relu, max_pool2d<2>,
                    flatten, linear<128>, relu, linear<10>>;

}  // namespace

TEST_CASE("cpu::gemm in bf16 is the float product of bf16-rounded operands, for every transposition, alpha and beta",
          "[layers][bf16]") {
  REQUIRE(cpu::supports(math_mode::bf16));
  const std::size_t m = 37, n = 29, k = 300;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{1.0f, 1.0f}, std::pair{0.5f, -2.0f}}) {
        // Leading dimensions larger than the rows, as a view into a bigger matrix would have.
        const std::size_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
        const auto a = to_float(loom::testing::random_values((ta ? k : m) * lda, 11, 1.0, 0.0));
        const auto b = to_float(loom::testing::random_values((tb ? n : k) * ldb, 12, 1.0, 0.0));
        const auto c0 = to_float(loom::testing::random_values(m * ldc, 13, 1.0, 0.0));
        std::vector<float> c16(c0), c32(c0);
        cpu::gemm(ta != 0, tb != 0, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c16.data(), ldc, math_mode::bf16);
        cpu::gemm(ta != 0, tb != 0, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c32.data(), ldc);
        // Reference in double over the rounded operands.
        std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), cd(c0.begin(), c0.end());
        ad = bf16_rounded(ad);
        bd = bf16_rounded(bd);
        cpu::gemm<double>(ta != 0, tb != 0, m, n, k, alpha, ad.data(), lda, bd.data(), ldb, beta, cd.data(), ldc);
        std::vector<float> got, ref, f32;
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            got.push_back(c16[i * ldc + j]);
            ref.push_back(static_cast<float>(cd[i * ldc + j]));
            f32.push_back(c32[i * ldc + j]);
          }
        for (std::size_t i = 0; i < m; ++i)  // the padding columns of C are not written
          for (std::size_t j = n; j < ldc; ++j) CHECK(c16[i * ldc + j] == c0[i * ldc + j]);
        const double floor = floor_fraction * max_abs(std::span<const float>(ref));
        const auto exact = compare_relative(got, ref, floor);
        const double near = normwise_error(got, f32);
        INFO("trans_a " << ta << " trans_b " << tb << " alpha " << alpha << " beta " << beta << ": vs rounded reference "
                        << exact.str() << ", vs fp32 normwise " << near);
        CHECK(exact.max_error < exact_tolerance);
        CHECK(near < bf16_tolerance);
        CHECK(near > bf16_at_least);
      }
}

TEST_CASE("linear in bf16: output and gradients are products of bf16-rounded operands, near fp32 but not equal",
          "[layers][bf16][linear]") {
  check_layer<one_linear>(16, 31);
  check_layer<one_linear>(16, 32, /*accumulate_twice=*/true);
  check_input_gradient<linear<70>, shape<300>>(16, 33);
}

TEST_CASE("conv2d in bf16: output and gradients are products of bf16-rounded operands, near fp32 but not equal",
          "[layers][bf16][conv2d]") {
  check_layer<one_conv>(4, 41);
  check_layer<one_conv>(3, 42, /*accumulate_twice=*/true);
  check_layer<strided_conv>(5, 43);
  check_layer<small_conv>(6, 46, false, /*bias=*/false);
  check_layer<small_conv>(3, 47, /*accumulate_twice=*/true, /*bias=*/false);
  check_layer<small_strided_conv>(5, 48);
  check_layer<small_strided_conv>(2, 49, /*accumulate_twice=*/true);
  check_layer<tiny_conv>(7, 50, false, /*bias=*/false);
  check_layer<tiny_conv>(3, 51, /*accumulate_twice=*/true, /*bias=*/false);
  check_layer<tiny_strided_conv>(5, 52);
  check_input_gradient<conv2d<40, 3, 1, 1, no_bias>, shape<32, 2, 2>>(6, 53);
  check_input_gradient<conv2d<48, 3, 2, 1>, shape<24, 4, 4>>(5, 54);
  check_input_gradient<conv2d<16, 1, 2, 0, no_bias>, shape<32, 4, 4>>(4, 55);
  check_input_gradient<conv2d<16, 3, 1, 1>, shape<3, 12, 12>>(4, 44);
  check_input_gradient<conv2d<5, 3, 2, 0>, shape<8, 9, 9>>(3, 45);
}

TEST_CASE("A bf16 convolution run as matmuls takes each batch's own input, also from the same buffer",
          "[layers][bf16][conv2d]") {
  // forward and backward of batch a, then of batch b in the same memory: b's results are those
  // of a fresh network on b (nothing of a's columns or conversions kept).
  using net = network<input<32, 2, 2>, conv2d<40, 3, 1, 1, no_bias>, relu, flatten, linear<3>>;
  const std::size_t batch = 4;
  const auto p = to_float(loom::testing::random_values(net::parameter_count, 71, 0.3, 0.0));
  const auto a = to_float(loom::testing::random_values(batch * net::input_shape::size, 72, 1.0, 0.0));
  const auto b = to_float(loom::testing::random_values(batch * net::input_shape::size, 73, 1.0, 0.0));
  const auto dy = to_float(loom::testing::random_values(batch * 3, 74, 1.0, 0.0));
  run_context ctx;
  ctx.math = math_mode::bf16;
  auto pass = [&](model<net, float>& m, const std::vector<float>& x) {
    const float* y = m.forward(ctx, x.data(), batch);
    std::vector<float> out(y, y + batch * 3);
    m.backward(ctx, dy.data(), batch);
    const auto g = m.gradients();
    out.insert(out.end(), g.begin(), g.end());
    return out;
  };
  model<net, float> reused(1), fresh(1);
  std::copy(p.begin(), p.end(), reused.parameters().begin());
  std::copy(p.begin(), p.end(), fresh.parameters().begin());
  std::vector<float> x = a;
  const auto first = pass(reused, x);
  x = b;  // the same buffer
  const auto second = pass(reused, x);
  CHECK(second == pass(fresh, x));
  CHECK(first != second);

  // The ReLU fused into forward's matmul: the unfused output, clipped at 0, bit for bit.
  using unfused = network<input<32, 2, 2>, conv2d<40, 3, 1, 1, no_bias>>;
  using fused = network<input<32, 2, 2>, conv2d<40, 3, 1, 1, no_bias>, relu>;
  model<unfused, float> u(1);
  model<fused, float> f(1);
  std::copy_n(p.begin(), unfused::parameter_count, u.parameters().begin());
  std::copy_n(p.begin(), fused::parameter_count, f.parameters().begin());
  const float* yu = u.forward(ctx, x.data(), batch);
  std::vector<float> clipped(yu, yu + batch * unfused::output_shape::size);
  std::size_t negative = 0;
  for (float& v : clipped) negative += v < 0, v = v > 0 ? v : 0.0f;
  const float* yf = f.forward(ctx, x.data(), batch);
  CHECK(negative > 0);
  CHECK(std::vector<float>(yf, yf + clipped.size()) == clipped);
}

TEST_CASE("The example cnn in bf16 stays near fp32, repeats bit for bit, and fp32 runs after it are unchanged",
          "[layers][bf16]") {
  const std::size_t batch = 8;
  const auto x = to_float(loom::testing::random_values(batch * cnn::input_shape::size, 51, 1.0, 0.0));
  const auto dy = to_float(loom::testing::random_values(batch * cnn::output_shape::size, 52, 0.1, 0.0));
  auto step = [&](model<cnn, float>& m, math_mode mode) {
    run_context ctx;
    ctx.math = mode;
    const float* y = m.forward(ctx, x.data(), batch);
    std::vector<float> out(y, y + batch * cnn::output_shape::size);
    m.backward(ctx, dy.data(), batch);
    const auto g = m.gradients();
    out.insert(out.end(), g.begin(), g.end());
    return out;
  };
  model<cnn, float> a(9), b(9);
  const auto fp32_first = step(a, math_mode::fp32);
  const auto bf16 = step(a, math_mode::bf16);  // the same model: cached fp32 primitives stay apart
  const auto fp32_again = step(a, math_mode::fp32);
  CHECK(bitwise_equal(fp32_first, fp32_again));
  CHECK(bitwise_equal(fp32_first, step(b, math_mode::fp32)));
  CHECK(bitwise_equal(bf16, step(b, math_mode::bf16)));  // bf16 runs repeat bit for bit too
  // Output and each layer's gradients, normwise. The output stays within 1e-2. Gradients of
  // the early layers move more (measured: 9% for the first conv2d at this batch of 8): bf16
  // flips some ReLU masks and max-pool choices, which sends whole terms of the backward pass
  // elsewhere, and weight gradients are sums that cancel to far less than their terms.
  const std::span<const float> y16(bf16.data(), batch * 10), y32(fp32_first.data(), batch * 10);
  INFO("output, normwise " << normwise_error(y16, y32));
  CHECK(normwise_error(y16, y32) < bf16_tolerance);
  CHECK(normwise_error(y16, y32) > bf16_at_least);
  for (std::size_t l = 0; l < cnn::layer_count; ++l) {
    const std::size_t at = batch * 10 + cnn::parameter_offsets[l], count = cnn::parameter_counts[l];
    if (count == 0) continue;
    const std::span<const float> g16(bf16.data() + at, count), g32(fp32_first.data() + at, count);
    const double e = normwise_error(g16, g32);
    INFO("layer " << l << ": |g_bf16 - g_fp32| / |g_fp32| = " << e);
    CHECK(e < 0.15);
    CHECK(e > bf16_at_least);
  }
}

namespace {

/// Consumers of a bf16 convolution's output, which oneDNN's AMX kernels write channels-last
/// (nhwc) and loom hands on as it is: the fused batch norm + ReLU, max and average pooling over
/// 32 channels (two interleaved blocks of 16 a pixel), global average pooling (one block of
/// all 32 channels); and a residual addition of a plain input to a channels-last branch.
using after_conv = network<input<16, 8, 8>, conv2d<32, 3, 1, 1, no_bias>, batch_norm, relu, max_pool2d<2>,
                           avg_pool2d<2>, global_avg_pool2d>;
using residual_after = network<input<32, 6, 6>, residual_with<layers<conv2d<32, 3, 1, 1, no_bias>, batch_norm>>, relu,
                               max_pool2d<2>, global_avg_pool2d>;
/// 16 channels channels-last are nChw16c byte for byte: the batch norm runs oneDNN's blocked
/// kernels on them.
using sixteen_after = network<input<16, 8, 8>, conv2d<16, 3, 1, 1, no_bias>, batch_norm, relu, max_pool2d<2>,
                              global_avg_pool2d>;

/// bf16 against fp32 on operands already bf16 (parameters, input, output gradient): the
/// convolution's products are then the same, so its output and everything computed from it in
/// float agree to float rounding, whatever layouts the two runs kept activations in — a layer
/// reading channels-last as another layout would be wrong by whole values. The convolution's
/// weight gradient takes the batch norm's input gradient rounded to bf16: within bf16's
/// tolerance only.
template <class Network>
void check_bf16_exact_operands(std::size_t batch, std::uint64_t seed, std::size_t conv_weights) {
  auto p = bf16_rounded(loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.0));
  const auto x = bf16_rounded(loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0));
  const auto dy = bf16_rounded(loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0));
  const auto bf = run<Network, float>(math_mode::bf16, to_float(p), to_float(x), to_float(dy), batch);
  const auto fp = run<Network, float>(math_mode::fp32, to_float(p), to_float(x), to_float(dy), batch);
  const auto part = [](const std::vector<float>& v, std::size_t from, std::size_t to) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to));
  };
  const auto exact = [](const char* what, const std::vector<float>& a, const std::vector<float>& b) {
    const auto e = compare_relative(a, b, floor_fraction * max_abs(std::span<const float>(b)));
    INFO(what << ": bf16 vs fp32 on bf16 operands " << e.str());
    CHECK(max_abs(std::span<const float>(b)) > 0);
    CHECK(e.max_error < exact_tolerance);
  };
  exact("output", bf.y, fp.y);
  const std::size_t all = Network::parameter_count;
  exact("batch norm's gradients", part(bf.grads, conv_weights, all), part(fp.grads, conv_weights, all));
  const auto w16 = part(bf.grads, 0, conv_weights), w32 = part(fp.grads, 0, conv_weights);
  INFO("convolution's weight gradient, normwise " << normwise_error(w16, w32));
  CHECK(max_abs(std::span<const float>(w32)) > 0);
  CHECK(normwise_error(w16, w32) < bf16_tolerance);
}

}  // namespace

TEST_CASE("Layers after a bf16 convolution read its channels-last output as fp32 runs read theirs",
          "[layers][bf16][channels_last]") {
  // Where oneDNN runs AMX kernels, its bf16 convolution of 16 or more channels writes nhwc: the
  // layout this case is about (without AMX — a CPU without it, or oneDNN kept below it by
  // ONEDNN_MAX_CPU_ISA — its kernels write a blocked layout, also checked).
  const std::size_t batch = 4;
  const bool amx = detect_cpu_features().onednn_isa.find("amx") != std::string::npos;
  cpu_conv2d_plan<float> conv(conv2d_geometry{16, 8, 8, 32, 3, 1, 1, false});
  std::vector<float> x(batch * 16 * 64, 0.5f), w(32 * 16 * 9, 0.25f), y(batch * 32 * 64);
  const cpu_format f = conv.forward(x.data(), {}, w.data(), nullptr, y.data(), batch, math_mode::bf16);
  INFO("oneDNN on AMX: " << amx << "; the bf16 convolution's output channels-last: "
               << detail::is_channels_last(f, batch, 32, 8, 8));
  if (amx) CHECK(detail::is_channels_last(f, batch, 32, 8, 8));
  CHECK(detail::channel_block(f, batch, 32, 8, 8) != 0);
  SECTION("batch norm with its ReLU, max and average pooling, global average pooling") {
    check_bf16_exact_operands<after_conv>(batch, 61, 32 * 16 * 9);
  }
  SECTION("a residual block adding its plain input to a channels-last branch") {
    check_bf16_exact_operands<residual_after>(batch, 62, 32 * 32 * 9);
  }
  SECTION("16 channels: batch norm on them as oneDNN's blocked layout") {
    check_bf16_exact_operands<sixteen_after>(batch, 63, 16 * 16 * 9);
  }
}

template <std::size_t C>
void check_synchronized_channels_last() {
  // Two replicas with different halves of a batch, synchronized through two threads, against
  // one replica of the whole, both in bf16. Each replica's convolution sees the same bf16
  // operands as the whole's, so outputs and statistics agree to float rounding; the input
  // gradient each replica corrects from its own sums to the group's (a + b x per channel, over
  // C channels a pixel) reaches the convolution's weight gradient, rounded to bf16 there.
  using net = network<input<16, 4, 4>, conv2d<C, 3, 1, 1, no_bias>, batch_norm, relu, global_avg_pool2d>;
  const std::size_t batch = 3, in = net::input_shape::size, out = net::output_shape::size;
  model<net, float> halves[2] = {model<net, float>(7), model<net, float>(7)};
  model<net, float> whole(7);
  const auto x = to_float(bf16_rounded(loom::testing::random_values(2 * batch * in, 71, 1.0, 0.0)));
  const auto dy = to_float(bf16_rounded(loom::testing::random_values(2 * batch * out, 72, 1.0, 0.0)));
  const std::vector<float> y = loom::testing::train_halves(halves, x, dy, batch, math_mode::bf16);
  run_context ctx;
  ctx.math = math_mode::bf16;
  const float* yw = whole.forward(ctx, x.data(), 2 * batch);
  whole.backward(ctx, dy.data(), 2 * batch);
  const std::vector<float> whole_y(yw, yw + y.size());
  const auto e = compare_relative(y, whole_y, floor_fraction * max_abs(std::span<const float>(whole_y)));
  INFO("outputs, halves against the whole: " << e.str());
  CHECK(e.max_error < exact_tolerance);
  const auto g0 = halves[0].copy_gradients_to_host(), g1 = halves[1].copy_gradients_to_host();
  const auto gw = whole.copy_gradients_to_host();
  std::vector<float> sum(g0.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = g0[i] + g1[i];
  const std::size_t weights = C * 16 * 9;
  const std::vector<float> bn(sum.begin() + weights, sum.end()), bn_whole(gw.begin() + weights, gw.end());
  const auto eb = compare_relative(bn, bn_whole, floor_fraction * max_abs(std::span<const float>(bn_whole)));
  INFO("batch norm's gradients added up, against the whole's: " << eb.str());
  CHECK(eb.max_error < exact_tolerance);
  const std::vector<float> cw(sum.begin(), sum.begin() + weights), cw_whole(gw.begin(), gw.begin() + weights);
  INFO("convolution's weight gradients added up, against the whole's, normwise " << normwise_error(cw, cw_whole));
  CHECK(max_abs(std::span<const float>(cw_whole)) > 0);
  CHECK(normwise_error(cw, cw_whole) < bf16_tolerance);
}

TEST_CASE("A synchronized batch norm after a bf16 convolution corrects a channels-last input gradient",
          "[layers][bf16][channels_last][batch_norm]") {
  SECTION("32 channels a pixel") { check_synchronized_channels_last<32>(); }
  SECTION("16 channels (the batch norm's primitive on oneDNN's blocked layout)") { check_synchronized_channels_last<16>(); }
}

TEST_CASE("A residual block under bf16 math writes its sum's bf16 copy, as oneDNN rounds, for the convolutions after it",
          "[layers][bf16][residual]") {
  // The block's output and, under bf16 math, its bf16 copy (activation::bf16): each value
  // rounded to nearest even, in the output's own layout; none under fp32.
  using block = residual_with<layers<conv2d<16, 3, 1, 1>, relu, conv2d<16, 3, 1, 1>>>;
  const std::size_t batch = 3;
  using in = shape<16, 6, 6>;
  auto check = [&]<class Seq>(Seq& s, bool relu_after) {
    std::vector<float> params(Seq::parameter_count);
    s.initialize(params.data(), 5);
    const auto xd = loom::testing::random_values(batch * in::size, 81, 1.0, 0.0);
    const std::vector<float> x(xd.begin(), xd.end());
    run_context ctx;
    ctx.math = math_mode::fp32;
    CHECK(s.forward(ctx, params.data(), {x.data(), {}}, batch).bf16 == nullptr);
    ctx.math = math_mode::bf16;
    const activation<float, cpu> y = s.forward(ctx, params.data(), {x.data(), {}}, batch);
    REQUIRE(y.bf16 != nullptr);
    std::size_t differ = 0, negative = 0;
    for (std::size_t i = 0; i < batch * in::size; ++i) {
      differ += y.bf16[i] != detail::bf16_bits(y.data[i]);
      negative += y.data[i] < 0;
    }
    CHECK(differ == 0);
    if (relu_after) CHECK(negative == 0);
    else CHECK(negative > 0);
  };
  SECTION("with the ReLU after it fused into the sum") {
    sequence<float, cpu, in, block, relu> s;
    check(s, true);
  }
  SECTION("alone") {
    sequence<float, cpu, in, block> s;
    check(s, false);
  }
}

TEST_CASE("A bf16 convolution given its input's bf16 copy computes what it computes converting the input itself",
          "[layers][bf16][channels_last]") {
  // x channels-last (the layout a bf16 convolution writes on AMX, and takes): with x's copy
  // rounded as oneDNN rounds, output and gradients are bit for bit those of the convolution's
  // own conversion. Where the convolution takes x channels-last the copy is what it reads
  // (forward, and the weight gradient after it): a copy of other values changes them; where it
  // takes another layout (no AMX) the copy is left alone.
  const std::size_t batch = 4;
  const conv2d_geometry g{16, 8, 8, 32, 3, 1, 1, true};
  const bool amx = detect_cpu_features().onednn_isa.find("amx") != std::string::npos;
  const cpu_format xf = detail::channels_last_nchw(batch, 16, 8, 8);
  const auto xd = loom::testing::random_values(batch * 16 * 64, 91, 1.0, 0.0);
  const auto wd = loom::testing::random_values(g.weight_count(), 92, 0.3, 0.0);
  const auto dyd = loom::testing::random_values(batch * 32 * 64, 93, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), dy_plain(dyd.begin(), dyd.end()),
      b(32, 0.125f);
  std::vector<std::uint16_t> same(x.size()), other(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    same[i] = detail::bf16_bits(x[i]);
    other[i] = detail::bf16_bits(2 * x[i]);
  }
  struct result {
    std::vector<float> y, dx, dw, db;
  };
  auto run = [&](cpu_conv2d_plan<float>& conv, const std::vector<float>& input, const std::uint16_t* copy) {
    result r{std::vector<float>(batch * 32 * 64), std::vector<float>(x.size()), std::vector<float>(w.size()),
             std::vector<float>(32)};
    const cpu_format yf = conv.forward(input.data(), xf, w.data(), b.data(), r.y.data(), batch, math_mode::bf16, copy);
    std::vector<float> dy(dy_plain.size());
    cpu::layout_converter c;
    c.from_plain<float, shape<32, 8, 8>>(dy_plain.data(), yf, dy.data(), batch);
    conv.backward(input.data(), xf, w.data(), dy.data(), r.dx.data(), r.dw.data(), r.db.data(), batch, false,
                  math_mode::bf16);
    return r;
  };
  auto equal = [](const result& a, const result& c) {
    return bitwise_equal(a.y, c.y) && bitwise_equal(a.dx, c.dx) && bitwise_equal(a.dw, c.dw) && bitwise_equal(a.db, c.db);
  };
  cpu_conv2d_plan<float> converting(g), given(g), wrong(g);
  const result own = run(converting, x, nullptr);
  CHECK(equal(run(given, x, same.data()), own));
  const result with_other = run(wrong, x, other.data());
  INFO("oneDNN on AMX (takes x channels-last): " << amx);
  if (amx) {
    CHECK_FALSE(bitwise_equal(with_other.y, own.y));
    CHECK_FALSE(bitwise_equal(with_other.dw, own.dw));
    CHECK(bitwise_equal(with_other.dx, own.dx));  // the input gradient reads no x
  } else {
    CHECK(equal(with_other, own));
  }
  // The next forward without a copy converts its own x (none of the last one's copy is kept).
  std::vector<float> x2(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x2[i] = 0.5f - x[i];
  cpu_conv2d_plan<float> fresh(g);
  CHECK(equal(run(given, x2, nullptr), run(fresh, x2, nullptr)));
}

TEST_CASE("Batch norm's own passes write the bf16 copies of y and dx that the convolutions next to it read",
          "[layers][bf16][batch_norm][rows]") {
  // The plan on channels-last of 32 channels (its own passes): asked for them, the copies are
  // each value of y (after the fused ReLU) and of dx rounded as oneDNN rounds; y and dx are bit
  // for bit what they are without copies; not asked, none.
  const std::size_t batch = 4, c = 32, hw = 6, n = batch * c * hw * hw;
  const batch_norm_geometry g{c, hw, hw, 3};
  const cpu_format xf = detail::channels_last_nchw(batch, c, hw, hw);
  const auto xd = loom::testing::random_values(n, 101, 1.0, 0.0), dyd = loom::testing::random_values(n, 102, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end()), w(c, 1.25f), b(c, 0.5f);
  auto run = [&](cpu_batch_norm_plan<float>& p, bool copies, std::vector<float>& y, std::vector<float>& dx) {
    std::vector<float> rm(c, 0.0f), rv(c, 1.0f), dw(c), db(c);
    p.forward_training(x.data(), xf, w.data(), b.data(), y.data(), rm.data(), rv.data(), 0.1, batch, nullptr, copies);
    p.backward(x.data(), xf, w.data(), b.data(), dy.data(), dx.data(), dw.data(), db.data(), batch, false, nullptr,
               y.data(), copies);
  };
  std::vector<float> y1(n), dx1(n), y2(n), dx2(n);
  cpu_batch_norm_plan<float> with(g), without(g);
  with.fuse_relu();
  without.fuse_relu();
  run(with, true, y1, dx1);
  run(without, false, y2, dx2);
  CHECK(bitwise_equal(y1, y2));
  CHECK(bitwise_equal(dx1, dx2));
  CHECK(without.output_bf16() == nullptr);
  CHECK(without.input_gradient_bf16() == nullptr);
  REQUIRE(with.output_bf16() != nullptr);
  REQUIRE(with.input_gradient_bf16() != nullptr);
  std::size_t differ = 0, zeros = 0;
  for (std::size_t i = 0; i < n; ++i) {
    differ += with.output_bf16()[i] != detail::bf16_bits(y1[i]);
    differ += with.input_gradient_bf16()[i] != detail::bf16_bits(dx1[i]);
    zeros += y1[i] == 0.0f;
  }
  CHECK(differ == 0);
  CHECK(zeros > 0);  // the fused ReLU clipped some (and their copies are +0)
}

TEST_CASE("Batch norm writes a copy alone where asked to, leaving y and dx as they were",
          "[layers][bf16][batch_norm][rows]") {
  // The plan on channels-last (its own passes), 16 and 48 channels (a row of one vector, and of
  // groups): with copy_only the copies are bit for bit those written beside the floats, and y
  // and dx keep the NaNs put there before.
  for (const std::size_t c : {std::size_t{16}, std::size_t{48}}) {
    CAPTURE(c);
    const std::size_t batch = 3, hw = 5, n = batch * c * hw * hw;
    const batch_norm_geometry g{c, hw, hw, 3};
    const cpu_format xf = detail::channels_last_nchw(batch, c, hw, hw);
    const auto xd = loom::testing::random_values(n, 131, 1.0, 0.0), dyd = loom::testing::random_values(n, 132, 1.0, 0.0);
    const std::vector<float> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end()), w(c, 0.75f), b(c, 0.25f);
    struct result {
      std::vector<float> y, dx, dw, db, running;
      std::vector<std::uint16_t> y16, dx16;
    };
    auto run = [&](bool copy_only) {
      cpu_batch_norm_plan<float> p(g);
      p.fuse_relu();
      result r{std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()),
               std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()), std::vector<float>(c),
               std::vector<float>(c), std::vector<float>(2 * c, 0.0f), {}, {}};
      for (std::size_t k = 0; k < c; ++k) r.running[c + k] = 1.0f;
      p.forward_training(x.data(), xf, w.data(), b.data(), r.y.data(), r.running.data(), r.running.data() + c, 0.1,
                         batch, nullptr, true, true, copy_only);
      REQUIRE(p.output_bf16() != nullptr);
      r.y16.assign(p.output_bf16(), p.output_bf16() + n);
      p.backward(x.data(), xf, w.data(), b.data(), dy.data(), r.dx.data(), r.dw.data(), r.db.data(), batch, false,
                 nullptr, r.y.data(), true, copy_only);
      REQUIRE(p.input_gradient_bf16() != nullptr);
      r.dx16.assign(p.input_gradient_bf16(), p.input_gradient_bf16() + n);
      return r;
    };
    const result both = run(false), alone = run(true);
    CHECK(alone.y16 == both.y16);
    CHECK(alone.dx16 == both.dx16);
    CHECK(bitwise_equal(alone.dw, both.dw));
    CHECK(bitwise_equal(alone.db, both.db));
    CHECK(bitwise_equal(alone.running, both.running));
    CHECK(std::all_of(alone.y.begin(), alone.y.end(), [](float v) { return std::isnan(v); }));
    CHECK(std::all_of(alone.dx.begin(), alone.dx.end(), [](float v) { return std::isnan(v); }));
    CHECK(std::none_of(both.y.begin(), both.y.end(), [](float v) { return std::isnan(v); }));
    CHECK(std::none_of(both.dx.begin(), both.dx.end(), [](float v) { return std::isnan(v); }));
  }
}

TEST_CASE("A bf16 convolution that says it reads only the copies of x and dy reads nothing else of them",
          "[layers][bf16][channels_last]") {
  // Channels-last x (as a batch norm before it writes it), and convolutions of either path:
  // oneDNN's primitives (8x8) and, at 2x2, the weight gradient as a matmul (and at 1x1 from 64
  // channels, everything as matmuls). Where reads_copies_only says so, x's or dy's float values
  // turned to NaN change no bit of y, dx, dw.
  const bool amx = detect_cpu_features().onednn_isa.find("amx") != std::string::npos;
  for (const conv2d_geometry g : {conv2d_geometry{16, 8, 8, 32, 3, 1, 1, false}, conv2d_geometry{32, 2, 2, 32, 3, 1, 1, false},
                                  conv2d_geometry{64, 1, 1, 64, 3, 1, 1, false}, conv2d_geometry{16, 8, 8, 32, 3, 1, 1, true}}) {
    CAPTURE(g.c, g.h, g.oc, g.bias);
    const std::size_t batch = 4, xn = batch * g.c * g.h * g.w, yn = batch * g.oc * g.oh() * g.ow();
    const cpu_format xf = detail::channels_last_nchw(batch, g.c, g.h, g.w);
    const auto xd = loom::testing::random_values(xn, 141, 1.0, 0.0), wd = loom::testing::random_values(g.weight_count(), 142, 0.3, 0.0);
    const auto dyd = loom::testing::random_values(yn, 143, 1.0, 0.0);
    const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), dy(dyd.begin(), dyd.end());
    const std::vector<float> b(g.oc, 0.125f);
    std::vector<std::uint16_t> x16(xn), dy16(yn);
    for (std::size_t i = 0; i < xn; ++i) x16[i] = detail::bf16_bits(x[i]);
    for (std::size_t i = 0; i < yn; ++i) dy16[i] = detail::bf16_bits(dy[i]);
    const std::vector<float> nan_x(xn, std::numeric_limits<float>::quiet_NaN()),
        nan_dy(yn, std::numeric_limits<float>::quiet_NaN());
    struct result {
      std::vector<float> y, dx, dw, db;
    };
    auto run = [&](bool poison_x, bool poison_dy) {
      cpu_conv2d_plan<float> conv(g);
      result r{std::vector<float>(yn), std::vector<float>(xn), std::vector<float>(g.weight_count()), std::vector<float>(g.oc)};
      const float* xs = poison_x ? nan_x.data() : x.data();
      const cpu_format yf =
          conv.forward(xs, xf, w.data(), g.bias ? b.data() : nullptr, r.y.data(), batch, math_mode::bf16, x16.data());
      // dy in y's layout: the values are random either way, the layout does not matter here
      (void)yf;
      conv.backward(xs, xf, w.data(), poison_dy ? nan_dy.data() : dy.data(), r.dx.data(), r.dw.data(),
                    g.bias ? r.db.data() : nullptr, batch, false, math_mode::bf16, dy16.data());
      return r;
    };
    cpu_conv2d_plan<float> probe(g);
    const auto reads = probe.reads_copies_only(batch, xf, math_mode::bf16);
    CHECK_FALSE(probe.reads_copies_only(batch, xf, math_mode::fp32).input);
    CHECK_FALSE(probe.reads_copies_only(batch, xf, math_mode::fp32).output_gradient);
    INFO("oneDNN on AMX: " << amx << "; reads x's copy only: " << reads.input << ", dy's: " << reads.output_gradient);
    if (amx && !g.bias && g.h == 8) {  // ResNet's convolutions: both, on AMX's channels-last primitives
      CHECK(reads.input);
      CHECK(reads.output_gradient);
    }
    const result honest = run(false, false);
    const result poisoned = run(reads.input, reads.output_gradient);
    CHECK(bitwise_equal(poisoned.y, honest.y));
    CHECK(bitwise_equal(poisoned.dx, honest.dx));
    CHECK(bitwise_equal(poisoned.dw, honest.dw));
    CHECK(bitwise_equal(poisoned.db, honest.db));
    // and the check is one that can fail: NaN where the floats are read
    if (!reads.input) {
      const result x_read = run(true, false);
      CHECK_FALSE(bitwise_equal(x_read.dw, honest.dw));
    }
  }
}

TEST_CASE("A bf16 convolution given its output gradient's bf16 copy computes what it computes converting it itself",
          "[layers][bf16][channels_last]") {
  const std::size_t batch = 4;
  const conv2d_geometry g{16, 8, 8, 32, 3, 1, 1, false};
  const bool amx = detect_cpu_features().onednn_isa.find("amx") != std::string::npos;
  const auto xd = loom::testing::random_values(batch * 16 * 64, 111, 1.0, 0.0);
  const auto wd = loom::testing::random_values(g.weight_count(), 112, 0.3, 0.0);
  const auto dyd = loom::testing::random_values(batch * 32 * 64, 113, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), dy_plain(dyd.begin(), dyd.end());
  struct result {
    std::vector<float> dx, dw;
  };
  // copy: 0 none, 1 dy's, 2 another's (2 dy)
  auto run = [&](int copy) {
    cpu_conv2d_plan<float> conv(g);
    std::vector<float> y(batch * 32 * 64), dy(dy_plain.size());
    const cpu_format yf = conv.forward(x.data(), {}, w.data(), nullptr, y.data(), batch, math_mode::bf16);
    cpu::layout_converter c;
    c.from_plain<float, shape<32, 8, 8>>(dy_plain.data(), yf, dy.data(), batch);
    std::vector<std::uint16_t> d16(dy.size());
    for (std::size_t i = 0; i < dy.size(); ++i) d16[i] = detail::bf16_bits(copy == 2 ? 2 * dy[i] : dy[i]);
    result r{std::vector<float>(x.size()), std::vector<float>(w.size())};
    conv.backward(x.data(), {}, w.data(), dy.data(), r.dx.data(), r.dw.data(), nullptr, batch, false, math_mode::bf16,
                  copy ? d16.data() : nullptr);
    return r;
  };
  const result own = run(0), same = run(1), other = run(2);
  CHECK(bitwise_equal(same.dx, own.dx));
  CHECK(bitwise_equal(same.dw, own.dw));
  INFO("oneDNN on AMX (takes dy channels-last, as the convolution writes y): " << amx);
  if (amx) {
    CHECK_FALSE(bitwise_equal(other.dx, own.dx));
    CHECK_FALSE(bitwise_equal(other.dw, own.dw));
  }
}

namespace {
// The same layers twice, the second with identity poolings between each convolution and the
// batch norm next to it: there no layer writes a bf16 copy for a convolution (the poolings write
// none and sit where the copies would pass), so each convolution converts its own operands.
using copies_passed = network<input<16, 8, 8>, conv2d<32, 3, 1, 1, no_bias>, batch_norm, relu, conv2d<32, 3, 1, 1, no_bias>,
                              batch_norm, relu, residual_with<layers<conv2d<32, 3, 1, 1, no_bias>, batch_norm>>, relu,
                              conv2d<32, 3, 1, 1, no_bias>, batch_norm, relu, global_avg_pool2d>;
using copies_cut = network<input<16, 8, 8>, conv2d<32, 3, 1, 1, no_bias>, avg_pool2d<1>, batch_norm, relu, avg_pool2d<1>,
                           conv2d<32, 3, 1, 1, no_bias>, avg_pool2d<1>, batch_norm, relu,
                           residual_with<layers<conv2d<32, 3, 1, 1, no_bias>, batch_norm>>, relu, avg_pool2d<1>,
                           conv2d<32, 3, 1, 1, no_bias>, avg_pool2d<1>, batch_norm, relu, global_avg_pool2d>;
}  // namespace

TEST_CASE("A bf16 network whose layers hand on bf16 copies trains bit for bit as one whose convolutions convert",
          "[layers][bf16][channels_last][residual]") {
  static_assert(copies_passed::parameter_count == copies_cut::parameter_count);
  const std::size_t batch = 4;
  model<copies_passed, float> passed(3);
  model<copies_cut, float> cut(3);
  std::copy(passed.parameters().begin(), passed.parameters().end(), cut.parameters().begin());
  const auto xd = loom::testing::random_values(batch * copies_passed::input_shape::size, 121, 1.0, 0.0);
  const auto dyd = loom::testing::random_values(batch * copies_passed::output_shape::size, 122, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
  run_context ctx;
  ctx.math = math_mode::bf16;
  for (int step = 0; step < 2; ++step) {  // the second on primitives and copies made before
    const float* ya = passed.forward(ctx, x.data(), batch);
    const std::vector<float> a(ya, ya + batch * copies_passed::output_shape::size);
    const float* yb = cut.forward(ctx, x.data(), batch);
    const std::vector<float> b(yb, yb + a.size());
    CHECK(bitwise_equal(a, b));
    passed.backward(ctx, dy.data(), batch);
    cut.backward(ctx, dy.data(), batch);
    const auto ga = passed.copy_gradients_to_host(), gb = cut.copy_gradients_to_host();
    CHECK(bitwise_equal(ga, gb));
  }
  // And they are bf16 runs: not fp32's.
  run_context fp;
  const float* yf = passed.forward(fp, x.data(), batch);
  const std::vector<float> f(yf, yf + batch * copies_passed::output_shape::size);
  const float* yb = passed.forward(ctx, x.data(), batch);
  CHECK_FALSE(bitwise_equal(f, std::vector<float>(yb, yb + f.size())));
}
