// SPDX-License-Identifier: Apache-2.0
// Numerical gradient checks of every layer and loss, in double (the reference loops): the
// analytic gradients of all parameters and of the input against central finite differences,
// max relative error < 1e-6 (the measure and its floor: tests/support/gradient_check.hpp).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "gradient_check.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/dropout.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/layers/named.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/residual_with.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"

using namespace loom;
using loom::testing::gradient_check_options;
using loom::testing::gradient_check_report;

namespace {

constexpr double tolerance = 1e-6;

/// The gradient check of Network on a random batch: parameters randomised (so biases and
/// layer_norm gains are not their trivial initial values) unless keep_init, inputs distinct
/// and at least 0.05 away from 0.
template <class Network, class Objective = loom::testing::weighted_sum>
gradient_check_report check(std::size_t batch, gradient_check_options opt = {}, Objective objective = {},
                            bool keep_init = false, double input_scale = 1.0) {
  model<Network, double> m(3);
  if (!keep_init) loom::testing::randomize(m.parameters(), 11, 0.5, 0.01);
  const auto x = loom::testing::random_values(batch * Network::input_shape::size, 5, input_scale, 0.05);
  return loom::testing::check_gradients(m, std::span<const double>(x), batch, objective, opt);
}

#define CHECK_GRADIENTS(report)                                                       \
  do {                                                                                \
    const auto& r_ = (report);                                                        \
    INFO(r_.str());                                                                   \
    CHECK(r_.max_error() < tolerance);                                                \
    CHECK(r_.max_abs_gradient > 0);                                                   \
    CHECK(r_.model_mismatch == 0);                                                    \
  } while (false)

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layers with parameters

TEST_CASE("linear has correct weight, bias and input gradients", "[layers][linear][gradient]") {
  const auto r = check<network<input<7>, linear<5>>>(3);
  CHECK(r.parameters_checked == 7 * 5 + 5);
  CHECK(r.inputs_checked == 3 * 7);
  CHECK_GRADIENTS(r);
}

TEST_CASE("a stack of linear layers with activations has correct gradients", "[layers][linear][gradient]") {
  CHECK_GRADIENTS((check<network<input<6>, linear<5>, loom::tanh, linear<4>, sigmoid, linear<3>>>(4)));
}

TEST_CASE("conv2d with stride 1 and padding 1 has correct gradients", "[layers][conv2d][gradient]") {
  const auto r = check<network<input<2, 6, 6>, conv2d<3, 3, 1, 1>>>(2);
  CHECK(r.parameters_checked == 3 * 2 * 3 * 3 + 3);
  CHECK_GRADIENTS(r);
}

TEST_CASE("conv2d with stride 2 and no padding has correct gradients", "[layers][conv2d][gradient]") {
  // (6 - 3) / 2 + 1 = 2: the last row and column of the input are never read (zero gradient).
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, conv2d<3, 3, 2, 0>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 7, 7>, conv2d<3, 3, 2, 0>>>(2)));
}

TEST_CASE("conv2d with stride 2 and padding 1, and a 1x1 conv2d, have correct gradients", "[layers][conv2d][gradient]") {
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, conv2d<3, 3, 2, 1>>>(2)));
  CHECK_GRADIENTS((check<network<input<3, 4, 4>, conv2d<2, 1>>>(2)));
}

TEST_CASE("conv2d without bias has correct gradients and no bias", "[layers][conv2d][gradient]") {
  const auto r = check<network<input<2, 6, 6>, conv2d<3, 3, 2, 1, no_bias>>>(2);
  CHECK(r.parameters_checked == 3 * 2 * 3 * 3);
  CHECK_GRADIENTS(r);
  CHECK_GRADIENTS((check<network<input<3, 4, 4>, conv2d<4, 1, 2, 0, no_bias, init::xavier>>>(2)));
}

TEST_CASE("batch_norm in training has correct weight, bias and input gradients", "[layers][batch_norm][gradient]") {
  // Per feature of a vector, over the batch.
  const auto r = check<network<input<5>, batch_norm>>(4);
  CHECK(r.parameters_checked == 10);
  CHECK_GRADIENTS(r);
  // Per channel of an image, over the batch and the image; at the initial weight 1, bias 0 too.
  CHECK_GRADIENTS((check<network<input<3, 3, 4>, batch_norm>>(2)));
  CHECK_GRADIENTS((check<network<input<3, 3, 4>, batch_norm>>(2, {}, {}, true)));
  // After a convolution without bias, with the ReLU after it fused in.
  CHECK_GRADIENTS((check<network<input<2, 5, 5>, conv2d<4, 3, 1, 1, no_bias>, batch_norm, relu, conv2d<3, 3>>>(3)));
  // Two samples of one value each per channel: the smallest batch it takes.
  CHECK_GRADIENTS((check<network<input<4, 1, 1>, batch_norm, flatten, linear<2>>>(2)));
}

TEST_CASE("batch_norm in evaluation has correct gradients (the running statistics held fixed)",
          "[layers][batch_norm][gradient]") {
  gradient_check_options opt;
  opt.ctx.training = false;
  CHECK_GRADIENTS((check<network<input<2, 3, 3>, batch_norm, relu, conv2d<2, 2>>>(2, opt)));
}

TEST_CASE("layer_norm on a 1-D input has correct gain, bias and input gradients", "[layers][layer_norm][gradient]") {
  const auto r = check<network<input<10>, layer_norm>>(3);
  CHECK(r.parameters_checked == 20);
  CHECK_GRADIENTS(r);
  // The initial parameters (gain 1, bias 0) too.
  CHECK_GRADIENTS((check<network<input<10>, layer_norm>>(3, {}, {}, true)));
}

TEST_CASE("layer_norm on a 3-D input has correct gradients", "[layers][layer_norm][gradient]") {
  CHECK_GRADIENTS((check<network<input<2, 3, 4>, layer_norm>>(3)));
  CHECK_GRADIENTS((check<network<input<2, 4, 4>, conv2d<2, 3, 1, 1>, layer_norm, flatten, linear<3>>>(2)));
}

// ---------------------------------------------------------------------------------------------
// Layers without parameters: input gradients only

TEST_CASE("max_pool2d routes the gradient to each window's maximum", "[layers][max_pool2d][gradient]") {
  const auto r = check<network<input<2, 6, 6>, max_pool2d<2>>>(2);
  CHECK(r.parameters_checked == 0);
  CHECK(r.inputs_checked == 2 * 2 * 36);
  CHECK_GRADIENTS(r);
  // Overlapping windows (an input can be the maximum of two) and an uncovered border.
  CHECK_GRADIENTS((check<network<input<2, 7, 7>, max_pool2d<3, 2>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 7, 7>, max_pool2d<2>>>(2)));
}

TEST_CASE("avg_pool2d has correct gradients, also with Stride != Kernel", "[layers][avg_pool2d][gradient]") {
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, avg_pool2d<2>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 7, 7>, avg_pool2d<3, 2>>>(2)));  // overlapping windows
  CHECK_GRADIENTS((check<network<input<2, 8, 8>, avg_pool2d<2, 3>>>(2)));  // gaps between windows
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, avg_pool2d<3, 1>>>(2)));
}

TEST_CASE("pooling with padding never reads the padding and has correct gradients", "[layers][pool2d][gradient]") {
  // ResNet's stem pooling: 3x3 windows, stride 2, padded by 1 (torch.nn.MaxPool2d(3, 2, 1)).
  CHECK_GRADIENTS((check<network<input<2, 7, 7>, max_pool2d<3, 2, 1>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, max_pool2d<3, 2, 1>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, avg_pool2d<3, 2, 1>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 5, 5>, max_pool2d<2, 1, 1>>>(2)));
}

TEST_CASE("global_avg_pool2d averages each channel and has correct gradients", "[layers][global_avg_pool2d][gradient]") {
  const auto r = check<network<input<3, 4, 5>, global_avg_pool2d>>(2);
  CHECK(r.inputs_checked == 2 * 60);
  CHECK_GRADIENTS(r);
  CHECK_GRADIENTS((check<network<input<2, 5, 5>, conv2d<16, 3, 1, 1>, global_avg_pool2d, linear<3>>>(2)));
}

TEST_CASE("flatten passes gradients through unchanged", "[layers][flatten][gradient]") {
  CHECK_GRADIENTS((check<network<input<2, 3, 3>, flatten>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 4, 4>, conv2d<3, 3, 1, 1>, flatten, linear<4>>>(2)));
}

TEMPLATE_TEST_CASE("point-wise activations have correct input gradients", "[layers][activation][gradient]", relu,
                   leaky_relu, loom::tanh, sigmoid, gelu) {
  // Inputs up to +-3 reach into the saturating parts of tanh, sigmoid and gelu; none is within
  // 0.05 of the kink of relu and leaky_relu.
  const auto r = check<network<input<3, 4, 5>, TestType>>(2, {}, {}, false, 3.0);
  CHECK(r.inputs_checked == 2 * 60);
  CHECK_GRADIENTS(r);
  CHECK_GRADIENTS((check<network<input<6>, linear<8>, TestType, linear<3>>>(3)));
}

TEST_CASE("leaky_relu with a custom slope has correct gradients", "[layers][activation][gradient]") {
  CHECK_GRADIENTS((check<network<input<12>, leaky_relu_slope<200>>>(3)));
}

TEST_CASE("dropout in training mode has gradients matching its (deterministic) mask", "[layers][dropout][gradient]") {
  gradient_check_options opt;
  opt.ctx.training = true;
  opt.ctx.seed = 1234;
  opt.ctx.step = 7;
  using net = network<input<40>, dropout>;
  const auto r = check<net>(3, opt);
  CHECK_GRADIENTS(r);

  // The mask is really there: some inputs are dropped, the rest scaled by 2.
  model<net, double> m(3);
  const auto x = loom::testing::random_values(3 * 40, 5, 1.0, 0.05);
  const double* y = m.forward(opt.ctx, x.data(), 3);
  std::size_t dropped = 0, kept = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0) ++dropped;
    else if (y[i] == 2 * x[i]) ++kept;
  }
  CHECK(dropped + kept == x.size());
  CHECK(dropped > 20);
  CHECK(kept > 20);

  CHECK_GRADIENTS((check<network<input<8>, linear<10>, dropout_rate<30>, linear<3>>>(3, opt)));
  // In evaluation mode it is the identity.
  opt.ctx.training = false;
  CHECK_GRADIENTS((check<net>(3, opt)));
}

// ---------------------------------------------------------------------------------------------
// Residual connections

TEST_CASE("residual around linear + tanh has correct gradients", "[layers][residual][gradient]") {
  CHECK_GRADIENTS((check<network<input<6>, residual<linear<6>, loom::tanh>>>(3)));
  CHECK_GRADIENTS((check<network<input<5>, linear<6>, residual<linear<6>, loom::tanh>, residual<linear<6>>, linear<2>>>(3)));
}

TEST_CASE("residual around conv2d has correct gradients", "[layers][residual][gradient]") {
  CHECK_GRADIENTS((check<network<input<2, 5, 5>, residual<conv2d<2, 3, 1, 1>>>>(2)));
  CHECK_GRADIENTS((check<network<input<2, 5, 5>, conv2d<3, 3, 1, 1>, residual<relu, conv2d<3, 3, 1, 1>>, avg_pool2d<2>,
                                 layer_norm, flatten, linear<3>>>(2)));
}

TEST_CASE("residual_with and its shortcut have correct gradients", "[layers][residual_with][gradient]") {
  // A downsampling block: the shortcut a strided 1x1 convolution without bias and a batch norm.
  using block = residual_with<layers<named<"conv1", conv2d<4, 3, 2, 1, no_bias>>, named<"bn1", batch_norm>, relu,
                                     named<"conv2", conv2d<4, 3, 1, 1, no_bias>>, named<"bn2", batch_norm>>,
                              named<"downsample", shortcut<conv2d<4, 1, 2, 0, no_bias>, batch_norm>>>;
  CHECK_GRADIENTS((check<network<input<2, 6, 6>, block, relu, global_avg_pool2d, linear<3>>>(3)));
  // The identity shortcut, a ReLU fused into the sum, and a block as the first layer.
  using same = residual_with<layers<conv2d<2, 3, 1, 1, no_bias>, batch_norm>>;
  CHECK_GRADIENTS((check<network<input<2, 4, 4>, same, relu, same>>(2)));
  // A shortcut of vectors.
  CHECK_GRADIENTS((check<network<input<5>, residual_with<layers<linear<3>, loom::tanh>, shortcut<linear<3>>>>>(3)));
}

TEST_CASE("nested residuals have correct gradients", "[layers][residual][gradient]") {
  CHECK_GRADIENTS((check<network<input<4>, residual<linear<4>, residual<linear<4>, gelu>, loom::tanh>>>(3)));
}

// ---------------------------------------------------------------------------------------------
// Losses

TEST_CASE("softmax_cross_entropy's gradient is that of the mean loss", "[layers][loss][gradient]") {
  const auto z = loom::testing::random_values(4 * 5, 9, 3.0, 0.0);
  const std::vector<std::int32_t> labels{0, 3, 4, 3};
  const auto r = loom::testing::check_loss_gradients<softmax_cross_entropy, 5>(z, labels);
  INFO(r.str());
  CHECK(r.inputs_checked == 20);
  CHECK(r.model_mismatch < 1e-14);  // loom's loss value against a long double reference
  CHECK(r.max_error() < tolerance);
  CHECK(r.max_abs_gradient > 0);
}

TEST_CASE("mse's gradient is that of the mean loss", "[layers][loss][gradient]") {
  const auto y = loom::testing::random_values(3 * 4, 9, 2.0, 0.0);
  const std::vector<std::int32_t> labels{1, 0, 3};
  const auto r = loom::testing::check_loss_gradients<mse, 4>(y, labels);
  INFO(r.str());
  CHECK(r.model_mismatch < 1e-14);
  CHECK(r.max_error() < tolerance);
  CHECK(r.max_abs_gradient > 0);
}

TEST_CASE("networks trained through a loss have correct gradients", "[layers][loss][gradient]") {
  using net = network<input<2, 6, 6>, conv2d<4, 3, 1, 1>, relu, max_pool2d<2>, flatten, linear<8>, gelu, linear<5>>;
  const std::vector<std::int32_t> labels{4, 0, 2};
  CHECK_GRADIENTS((check<net>(3, {}, loom::testing::loss_objective<softmax_cross_entropy, 5>(labels), true)));
  CHECK_GRADIENTS((check<net>(3, {}, loom::testing::loss_objective<mse, 5>(labels), true)));
}

// ---------------------------------------------------------------------------------------------
// The checker itself

namespace {
/// weighted_sum with a gradient off by a relative 1e-5: the check must see it.
struct slightly_wrong_objective : loom::testing::weighted_sum {
  void gradient(const double* y, double* dy, std::size_t n) {
    weighted_sum::gradient(y, dy, n);
    for (std::size_t i = 0; i < n; ++i) dy[i] *= 1 + 1e-5;
  }
};
}  // namespace

TEST_CASE("the gradient checker notices a gradient off by 1e-5", "[layers][gradient][support]") {
  const auto r = check<network<input<6>, linear<4>, loom::tanh>>(2, {}, slightly_wrong_objective{});
  INFO(r.str());
  // rel = 1e-5 |g| / (2 |g|) = 5e-6 on every component well above the floor.
  CHECK(r.parameter_error > 4e-6);
  CHECK(r.input_error > 4e-6);
  CHECK(r.max_error() > tolerance);
}

TEST_CASE("relative_error is symmetric, bounded and floored", "[layers][support]") {
  using loom::testing::relative_error;
  CHECK(relative_error(1.0, 1.0) == 0);
  CHECK(relative_error(0.0, 0.0) == 0);
  CHECK(relative_error(1.0, 1.1) == Approx(0.1 / 2.1));
  CHECK(relative_error(1.1, 1.0) == relative_error(1.0, 1.1));
  CHECK(relative_error(1.0, -1.0) == 1);
  CHECK(relative_error(1e-12, 0.0) == 1);
  CHECK(relative_error(1e-12, 0.0, 1e-6) == Approx(1e-6));
  CHECK(relative_error(std::nan(""), 1.0) == std::numeric_limits<double>::infinity());
  const std::vector<float> a{1, 2, 3};
  const std::vector<double> b{1, 2, 3.003};
  const auto c = loom::testing::compare_relative(a, b);
  CHECK(c.worst == 2);
  CHECK(c.max_error == Approx(0.003 / 6.003));
  CHECK_THAT(loom::testing::values_of(a), loom::testing::relatively_equals<float>(b, 1e-3));
  CHECK_THAT(loom::testing::values_of(a), !loom::testing::relatively_equals<float>(b, 1e-4));
  CHECK(loom::testing::compare_relative(a, std::vector<double>{1, 2}).max_error == std::numeric_limits<double>::infinity());
}
