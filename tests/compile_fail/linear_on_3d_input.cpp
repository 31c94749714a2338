// SPDX-License-Identifier: Apache-2.0
// loom::linear straight after a 3-D input, without loom::flatten.
// expect: loom::linear needs a 1-D input
// expect: linear_at_layer_needs_a_1d_input_but_got<0, loom::shape<1, 28, 28>
// max-errors: 2
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<1, 28, 28>, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
