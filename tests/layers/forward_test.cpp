// SPDX-License-Identifier: Apache-2.0
// Forward results of the layers and losses against small cases worked out by hand (the
// derivation is in the comment above each expectation). Every case runs in float (oneDNN,
// possibly in a blocked layout that model::forward converts back) and in double (the
// reference loops).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/layers/conv2d.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"
#include "relative_error.hpp"

using namespace loom;
using loom::testing::relatively_equals;
using loom::testing::values_of;

namespace {

/// Relative tolerance of a hand-computed value: a few ulps of T.
template <class T>
constexpr double tol = std::is_same_v<T, float> ? 1e-6 : 1e-13;

/// Runs Network in T on x (batch samples) with the given parameters; returns the plain output.
template <class Network, class T>
std::vector<T> run(const std::vector<double>& params, const std::vector<double>& x, std::size_t batch) {
  model<Network, T> m(1);
  REQUIRE(params.size() == Network::parameter_count);
  REQUIRE(x.size() == batch * Network::input_shape::size);
  auto p = m.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) p[i] = static_cast<T>(params[i]);
  const std::vector<T> xt(x.begin(), x.end());
  run_context eval;
  eval.training = false;
  const T* y = m.forward(eval, xt.data(), batch);
  std::vector<T> out(y, y + batch * Network::output_shape::size);
  // Training mode gives the same forward result.
  const T* yt = m.forward(run_context{}, xt.data(), batch);
  CHECK(std::vector<T>(yt, yt + out.size()) == out);
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("linear computes x W^T + b", "[layers][linear][forward]", float, double) {
  // W = [[1, 2, 3], [4, 5, 6]], b = [0.5, -1].
  // x = [1, -1, 2]:   [1 - 2 + 6 + 0.5, 4 - 5 + 12 - 1]   = [5.5, 10]
  // x = [0, 0.5, -2]: [0 + 1 - 6 + 0.5, 0 + 2.5 - 12 - 1] = [-4.5, -10.5]
  const auto y = run<network<input<3>, linear<2>>, TestType>({1, 2, 3, 4, 5, 6, 0.5, -1}, {1, -1, 2, 0, 0.5, -2}, 2);
  CHECK_THAT(values_of(y), relatively_equals<TestType>({5.5, 10, -4.5, -10.5}, tol<TestType>));
}

TEMPLATE_TEST_CASE("conv2d computes a valid 2x2 convolution with bias", "[layers][conv2d][forward]", float, double) {
  // x = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], W = [[1, 2], [3, 4]], b = 0.5.
  // y00 = 1*1 + 2*2 + 3*4 + 4*5 + 0.5 = 37.5    y01 = 1*2 + 2*3 + 3*5 + 4*6 + 0.5 = 47.5
  // y10 = 1*4 + 2*5 + 3*7 + 4*8 + 0.5 = 67.5    y11 = 1*5 + 2*6 + 3*8 + 4*9 + 0.5 = 77.5
  // The second sample is -x: -(W * x) + b.
  const auto y = run<network<input<1, 3, 3>, conv2d<1, 2>>, TestType>(
      {1, 2, 3, 4, 0.5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, -1, -2, -3, -4, -5, -6, -7, -8, -9}, 2);
  CHECK_THAT(values_of(y), relatively_equals<TestType>({37.5, 47.5, 67.5, 77.5, -36.5, -46.5, -66.5, -76.5}, tol<TestType>));
}

TEMPLATE_TEST_CASE("conv2d with stride 2 and padding 1 sums the padded windows", "[layers][conv2d][forward]", float,
                   double) {
  // 3x3 kernel of ones over x = [[1, 2, 3], [4, 5, 6], [7, 8, 9]] padded by one zero on each
  // side, stride 2: output (3 + 2 - 3) / 2 + 1 = 2 per side. Window (0, 0) covers padded rows
  // and columns -1..1, so x's [0..1][0..1]: 1 + 2 + 4 + 5 = 12; (0, 1) covers x[0..1][1..2]:
  // 2 + 3 + 5 + 6 = 16; (1, 0): 4 + 5 + 7 + 8 = 24; (1, 1): 5 + 6 + 8 + 9 = 28. Bias 0.
  std::vector<double> p(9, 1.0);
  p.push_back(0.0);
  const auto y = run<network<input<1, 3, 3>, conv2d<1, 3, 2, 1>>, TestType>(p, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>({12, 16, 24, 28}, tol<TestType>));
}

TEMPLATE_TEST_CASE("conv2d mixes channels", "[layers][conv2d][forward]", float, double) {
  // A 1x1 convolution from 2 to 2 channels: W (o, c) = [[1, 2], [3, -1]], b = [0, 1].
  // x channel 0 = [1, 2, 3, 4], channel 1 = [10, 20, 30, 40] (2x2 each).
  // y0 = x0 + 2 x1     = [21, 42, 63, 84]
  // y1 = 3 x0 - x1 + 1 = [3 - 10 + 1, 6 - 20 + 1, 9 - 30 + 1, 12 - 40 + 1] = [-6, -13, -20, -27]
  const auto y = run<network<input<2, 2, 2>, conv2d<2, 1>>, TestType>({1, 2, 3, -1, 0, 1},
                                                                     {1, 2, 3, 4, 10, 20, 30, 40}, 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>({21, 42, 63, 84, -6, -13, -20, -27}, tol<TestType>));
}

TEMPLATE_TEST_CASE("conv2d with 16 output channels comes back in plain channel order", "[layers][conv2d][forward]",
                   float, double) {
  // 16 channels is what a blocked layout (nChw16c / nChw8c) packs together in float; model's
  // output is plain NCHW again. W[o] = o + 1, b[o] = -o on one input channel x = [1, 2, 3, 4]:
  // y[o][i] = (o + 1) x_i - o; e.g. channel 0 = x, channel 15 = 16 x - 15 = [1, 17, 33, 49].
  std::vector<double> p;
  for (int o = 0; o < 16; ++o) p.push_back(o + 1);
  for (int o = 0; o < 16; ++o) p.push_back(-o);
  const std::vector<double> x{1, 2, 3, 4};
  std::vector<double> expected;
  for (int o = 0; o < 16; ++o)
    for (double xi : x) expected.push_back((o + 1) * xi - o);
  const auto y = run<network<input<1, 2, 2>, conv2d<16, 1>>, TestType>(p, {1, 2, 3, 4, 4, 3, 2, 1}, 2);
  // The second sample is x reversed.
  for (int o = 0; o < 16; ++o)
    for (int i = 3; i >= 0; --i) expected.push_back((o + 1) * x[static_cast<std::size_t>(i)] - o);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(expected, tol<TestType>));
  CHECK(y[15 * 4 + 3] == TestType(49));
}

namespace {
// One 4x4 channel for the pooling cases, and a second channel 2 x + 1 (a monotone map: its
// maxima sit in the same places and its averages are 2 avg + 1).
//   [ 1,  5,  2,  0]
//   [ 3,  4,  8,  7]
//   [-1, -2,  6,  9]
//   [-3, -4, 10, -5]
const std::vector<double> pool_channel{1, 5, 2, 0, 3, 4, 8, 7, -1, -2, 6, 9, -3, -4, 10, -5};
std::vector<double> pool_input() {
  std::vector<double> x = pool_channel;
  for (double v : pool_channel) x.push_back(2 * v + 1);
  return x;
}
std::vector<double> with_second_channel(std::vector<double> c0) {
  const std::size_t n = c0.size();
  for (std::size_t i = 0; i < n; ++i) c0.push_back(2 * c0[i] + 1);
  return c0;
}
}  // namespace

TEMPLATE_TEST_CASE("max_pool2d takes each window's maximum", "[layers][max_pool2d][forward]", float, double) {
  // 2x2 windows, stride 2: {1, 5, 3, 4} -> 5, {2, 0, 8, 7} -> 8, {-1, -2, -3, -4} -> -1,
  // {6, 9, 10, -5} -> 10.
  auto y = run<network<input<2, 4, 4>, max_pool2d<2>>, TestType>({}, pool_input(), 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(with_second_channel({5, 8, -1, 10}), tol<TestType>));
  // 3x3 windows, stride 1 (overlapping): rows 0-2 x cols 0-2 -> 8, rows 0-2 x cols 1-3 -> 9,
  // rows 1-3 x cols 0-2 -> 10, rows 1-3 x cols 1-3 -> 10.
  y = run<network<input<2, 4, 4>, max_pool2d<3, 1>>, TestType>({}, pool_input(), 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(with_second_channel({8, 9, 10, 10}), tol<TestType>));
  // 1x1 windows, stride 2 (Stride > Kernel): x[0][0], x[0][2], x[2][0], x[2][2] = 1, 2, -1, 6.
  y = run<network<input<2, 4, 4>, max_pool2d<1, 2>>, TestType>({}, pool_input(), 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(with_second_channel({1, 2, -1, 6}), tol<TestType>));
}

TEMPLATE_TEST_CASE("avg_pool2d averages each window", "[layers][avg_pool2d][forward]", float, double) {
  // 2x2 windows, stride 2: 13 / 4, 17 / 4, -10 / 4, 20 / 4.
  auto y = run<network<input<2, 4, 4>, avg_pool2d<2>>, TestType>({}, pool_input(), 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(with_second_channel({3.25, 4.25, -2.5, 5}), tol<TestType>));
  // 3x3 windows, stride 1 (Stride != Kernel):
  //   rows 0-2 x cols 0-2: 1 + 5 + 2 + 3 + 4 + 8 - 1 - 2 + 6  = 26 -> 26 / 9
  //   rows 0-2 x cols 1-3: 5 + 2 + 0 + 4 + 8 + 7 - 2 + 6 + 9  = 39 -> 39 / 9
  //   rows 1-3 x cols 0-2: 3 + 4 + 8 - 1 - 2 + 6 - 3 - 4 + 10 = 21 -> 21 / 9
  //   rows 1-3 x cols 1-3: 4 + 8 + 7 - 2 + 6 + 9 - 4 + 10 - 5 = 33 -> 33 / 9
  y = run<network<input<2, 4, 4>, avg_pool2d<3, 1>>, TestType>({}, pool_input(), 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(with_second_channel({26.0 / 9, 39.0 / 9, 21.0 / 9, 33.0 / 9}),
                                                       tol<TestType>));
  // 2x2 windows, stride 1: 3x3 outputs, window sums
  //   (0, 0) 1 + 5 + 3 + 4 = 13     (0, 1) 5 + 2 + 4 + 8 = 19      (0, 2) 2 + 0 + 8 + 7 = 17
  //   (1, 0) 3 + 4 - 1 - 2 = 4      (1, 1) 4 + 8 - 2 + 6 = 16      (1, 2) 8 + 7 + 6 + 9 = 30
  //   (2, 0) -1 - 2 - 3 - 4 = -10   (2, 1) -2 + 6 - 4 + 10 = 10    (2, 2) 6 + 9 + 10 - 5 = 20
  // each divided by 4.
  y = run<network<input<2, 4, 4>, avg_pool2d<2, 1>>, TestType>({}, pool_input(), 1);
  CHECK_THAT(values_of(y), relatively_equals<TestType>(
                               with_second_channel({13.0 / 4, 19.0 / 4, 17.0 / 4, 4.0 / 4, 16.0 / 4, 30.0 / 4, -10.0 / 4,
                                                    10.0 / 4, 20.0 / 4}),
                               tol<TestType>));
}

TEMPLATE_TEST_CASE("layer_norm normalises each sample and applies gain and bias", "[layers][layer_norm][forward]",
                   float, double) {
  // gain g = [1, 2, 0.5, -1], bias b = [0, 1, -1, 0.5], eps = 1e-5.
  // x = [1, 2, 3, 4]: mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25,
  //   r = 1 / sqrt(1.25 + 1e-5) = 0.894423613312618, xhat = [-1.5, -0.5, 0.5, 1.5] r,
  //   y = [-1.5 r, 1 - r, 0.25 r - 1, 0.5 - 1.5 r]
  //     = [-1.341635419968927, 0.105576386687382, -0.7763940966718455, -0.841635419968927]
  // x = [2, 2, 2, 6]: mean 3, variance (1 + 1 + 1 + 9) / 4 = 3,
  //   r = 1 / sqrt(3 + 1e-5) = 0.5773493069415827, xhat = [-1, -1, -1, 3] r,
  //   y = [-r, 1 - 2 r, -1 - 0.5 r, 0.5 - 3 r]
  //     = [-0.5773493069415827, -0.1546986138831654, -1.288674653470791, -1.232047920824748]
  const auto y = run<network<input<4>, layer_norm>, TestType>({1, 2, 0.5, -1, 0, 1, -1, 0.5}, {1, 2, 3, 4, 2, 2, 2, 6}, 2);
  CHECK_THAT(values_of(y), relatively_equals<TestType>({-1.341635419968927, 0.105576386687382, -0.7763940966718455,
                                                        -0.841635419968927, -0.5773493069415827, -0.1546986138831654,
                                                        -1.288674653470791, -1.232047920824748},
                                                       std::is_same_v<TestType, float> ? 1e-6 : 1e-12));
}

TEMPLATE_TEST_CASE("layer_norm on a 3-D input normalises over the whole sample", "[layers][layer_norm][forward]",
                   float, double) {
  // shape (2, 1, 2): x = [1, 2, 3, 4] as in the 1-D case, gain 1, bias 0:
  //   y = [-1.5, -0.5, 0.5, 1.5] * 0.894423613312618
  const auto y = run<network<input<2, 1, 2>, layer_norm>, TestType>({1, 1, 1, 1, 0, 0, 0, 0}, {1, 2, 3, 4}, 1);
  const double r = 0.894423613312618;
  CHECK_THAT(values_of(y), relatively_equals<TestType>({-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r},
                                                       std::is_same_v<TestType, float> ? 1e-6 : 1e-12));
}

TEMPLATE_TEST_CASE("softmax_cross_entropy gives the stable loss and gradient, even at extreme logits",
                   "[layers][loss][forward]", float, double) {
  using T = TestType;
  // Rows (3 classes) and labels:
  //   [1, 2, 3], label 2: loss = log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2) = 0.4076059644443801;
  //      softmax = [e^-2, e^-1, 1] / (1 + e^-1 + e^-2) = [0.09003057317038046, 0.2447284710547977,
  //      0.6652409557748219]; gradient = softmax - [0, 0, 1].
  //   [1000, 0, -1000], label 0: log-sum-exp = 1000 + log(1 + e^-1000 + e^-2000) = 1000 (the
  //      other terms underflow), loss = 0, softmax = [1, 0, 0], gradient = [0, 0, 0].
  //   the same, label 1: loss = 1000 - 0 = 1000, gradient = [1, -1, 0].
  //   the same, label 2: loss = 1000 + 1000 = 2000, gradient = [1, 0, -1].
  //   [0, 0, 0], label 1: loss = log 3 = 1.09861228866811, gradient = [1/3, -2/3, 1/3].
  //   [-1000, -1000, -1000], label 0: loss = log 3, gradient = [-2/3, 1/3, 1/3].
  // Correct predictions (argmax, the first on ties = class 0): rows 1 and 2, and row 6.
  const std::vector<T> z{1, 2, 3, 1000, 0, -1000, 1000, 0, -1000, 1000, 0, -1000, 0, 0, 0, -1000, -1000, -1000};
  const std::vector<std::int32_t> labels{2, 0, 1, 2, 1, 0};
  const std::size_t batch = labels.size();
  std::vector<T> grad(z.size());
  loss_workspace<cpu> ws;
  const auto v = softmax_cross_entropy::compute<cpu, 3>(z.data(), labels.data(), grad.data(), batch, T(1), ws);
  const double ln3 = 1.09861228866811;
  const std::vector<double> losses{0.4076059644443801, 0, 1000, 2000, ln3, ln3};
  const double t = std::is_same_v<T, float> ? 1e-6 : 1e-13;
  CHECK(std::isfinite(v.sum));
  CHECK(v.sum == Approx(0.4076059644443801 + 3000 + 2 * ln3).epsilon(t));
  CHECK(v.correct == 3);
  CHECK_THAT(values_of(ws.per_sample.data(), batch), relatively_equals<double>(losses, t, 1e-12));
  for (T g : grad) CHECK(std::isfinite(g));
  const std::vector<double> expected_grad{0.09003057317038046, 0.2447284710547977, 0.6652409557748219 - 1, 0, 0, 0, 1, -1,
                                          0, 1, 0, -1, 1.0 / 3, -2.0 / 3, 1.0 / 3, -2.0 / 3, 1.0 / 3, 1.0 / 3};
  CHECK_THAT(values_of(grad), relatively_equals<T>(expected_grad, t, 1e-12));

  // grad_scale multiplies the gradient (1 / batch for the mean loss), and a null gradient is
  // allowed.
  std::vector<T> scaled(z.size());
  softmax_cross_entropy::compute<cpu, 3>(z.data(), labels.data(), scaled.data(), batch, T(0.25), ws);
  for (std::size_t i = 0; i < z.size(); ++i) CHECK(scaled[i] == Approx(0.25 * expected_grad[i]).epsilon(t).margin(1e-12));
  const auto v2 = softmax_cross_entropy::compute<cpu, 3>(z.data(), labels.data(), static_cast<T*>(nullptr), batch, T(1), ws);
  CHECK(v2.sum == v.sum);
  CHECK(v2.correct == v.correct);
}

TEMPLATE_TEST_CASE("mse is the mean squared distance to the one-hot label", "[layers][loss][forward]", float, double) {
  using T = TestType;
  // y = [0.5, 1, -1], label 1: (0.5^2 + 0^2 + 1^2) / 3 = 1.25 / 3; gradient 2 (y - t) / 3 =
  //   [1 / 3, 0, -2 / 3]. y = [2, 0, 0], label 0: 1 / 3, gradient [2 / 3, 0, 0].
  // Correct: argmax of [0.5, 1, -1] is 1 (= label), of [2, 0, 0] is 0 (= label).
  const std::vector<T> y{0.5, 1, -1, 2, 0, 0};
  const std::vector<std::int32_t> labels{1, 0};
  std::vector<T> grad(6);
  loss_workspace<cpu> ws;
  const auto v = mse::compute<cpu, 3>(y.data(), labels.data(), grad.data(), 2, T(1), ws);
  CHECK(v.sum == Approx(1.25 / 3 + 1.0 / 3).epsilon(1e-6));
  CHECK(v.correct == 2);
  CHECK_THAT(values_of(grad), relatively_equals<T>({1.0 / 3, 0, -2.0 / 3, 2.0 / 3, 0, 0}, tol<T>));
}

// loom::cpu runs loom::linear as a bias pass and a GEMM, and a ReLU after it as a layer of its
// own: only a backend with a linear forward of its own (loom::cuda, through cuBLASLt's epilogue)
// fuses that ReLU.
static_assert(!loom::detail::has_linear_forward<loom::cpu>);
static_assert(!loom::detail::can_fuse_relu<loom::linear<4>::impl<loom::shape<8>, float, loom::cpu>>);

// The fusion rule, detail::fuses_into_previous: a relu after a layer whose implementation writes
// the ReLU itself (conv2d on loom::cpu, oneDNN's post-op); nothing else, and not after linear here.
using conv_impl = loom::conv2d<4, 3>::impl<loom::shape<1, 8, 8>, float, loom::cpu>;
static_assert(loom::detail::fuses_into_previous<conv_impl, loom::relu>);
static_assert(!loom::detail::fuses_into_previous<conv_impl, loom::tanh>);
static_assert(!loom::detail::fuses_into_previous<loom::linear<4>::impl<loom::shape<8>, float, loom::cpu>, loom::relu>);
