// SPDX-License-Identifier: Apache-2.0
// A pooling layer with kernel 0 (and so stride 0, its default), at layer 1.
// expect: loom pooling needs Kernel and Stride > 0
// expect: pool2d_at_layer_needs_positive_kernel_and_stride<1, 0, 0>
// max-errors: 2
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<1, 28, 28>, loom::conv2d<8, 3>, loom::max_pool2d<0>, loom::flatten, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
