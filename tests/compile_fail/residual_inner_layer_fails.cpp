// SPDX-License-Identifier: Apache-2.0
// A wrong layer inside a residual: the inner layer's own message, with its index in the
// inner stack; the residual adds nothing to it.
// expect: loom::linear needs a 1-D input
// expect: linear_at_layer_needs_a_1d_input_but_got<0, loom::shape<2, 8, 8>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<2, 8, 8>, loom::residual<loom::linear<128>, loom::relu>, loom::conv2d<4, 3>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
