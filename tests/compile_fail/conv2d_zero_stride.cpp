// SPDX-License-Identifier: Apache-2.0
// A convolution with stride 0, at layer 2.
// expect: loom::conv2d needs OutChannels, Kernel and Stride > 0
// expect: conv2d_at_layer_needs_positive_channels_kernel_and_stride<2, 16, 3, 0>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<1, 28, 28>, loom::conv2d<8, 3>, loom::relu, loom::conv2d<16, 3, 0>, loom::flatten,
                          loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
