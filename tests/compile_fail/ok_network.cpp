// SPDX-License-Identifier: Apache-2.0
// The control: correct networks using every checked layer compile, so the compile-fail cases
// fail for their own reason and not because the harness cannot compile loom code.
#include <cstddef>
#include <vector>

#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/layers/named.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/residual_with.hpp"
#include "loom/nn/model.hpp"

using mlp = loom::network<loom::input<784>, loom::linear<32>, loom::relu, loom::layer_norm, loom::linear<10>>;
using cnn = loom::network<loom::input<1, 6, 6>, loom::conv2d<4, 3, 1, 1>, loom::relu,
                          loom::residual<loom::conv2d<4, 3, 1, 1>, loom::relu>, loom::max_pool2d<2>,
                          loom::avg_pool2d<3>, loom::flatten, loom::linear<10>>;
using block = loom::residual_with<loom::layers<loom::conv2d<8, 3, 2, 1, loom::no_bias>, loom::batch_norm, loom::relu>,
                                  loom::named<"downsample", loom::shortcut<loom::conv2d<8, 1, 2, 0, loom::no_bias>>>>;
using resnet = loom::network<loom::input<3, 8, 8>, loom::named<"conv1", loom::conv2d<4, 3, 1, 1, loom::no_bias>>,
                             loom::batch_norm, loom::relu, loom::max_pool2d<3, 1, 1>, block, loom::relu,
                             loom::global_avg_pool2d, loom::linear<10>>;
static_assert(mlp::output_shape::size == 10 && cnn::output_shape::size == 10 && resnet::output_shape::size == 10);
static_assert(cnn::parameter_count == (4 * 9 + 4) + (4 * 4 * 9 + 4) + (4 * 10 + 10));

int main() {
  loom::model<mlp, float> a(1);
  loom::model<cnn, float> b(1);
  loom::model<resnet, float> c(1);
  std::vector<float> x(2 * cnn::input_shape::size, 0.5f);
  loom::run_context ctx;
  const float* y = b.forward(ctx, x.data(), 2);
  return (a.parameters().size() > 0 && y != nullptr && c.buffers().size() == resnet::buffer_count) ? 0 : 1;
}
