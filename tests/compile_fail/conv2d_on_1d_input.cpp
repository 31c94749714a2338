// SPDX-License-Identifier: Apache-2.0
// A convolution on a flat (1-D) input.
// expect: loom::conv2d needs a 3-D input
// expect: conv2d_at_layer_needs_a_3d_input_but_got<0, loom::shape<784>
// max-errors: 2
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<784>, loom::conv2d<8, 3>, loom::flatten, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
