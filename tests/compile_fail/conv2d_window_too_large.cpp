// SPDX-License-Identifier: Apache-2.0
// A 7 x 7 convolution on a 4 x 4 input without padding.
// expect: loom::conv2d's window is larger than its padded input
// expect: conv2d_window_larger_than_padded_input_at_layer<0, loom::shape<1, 4, 4>, 7, 0>
// max-errors: 2
#include "loom/layers/conv2d.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<1, 4, 4>, loom::conv2d<8, 7>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
