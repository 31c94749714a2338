// SPDX-License-Identifier: Apache-2.0
// A linear layer with no outputs, at layer 1.
// expect: loom::linear<Out> needs Out > 0
// expect: linear_at_layer_has_zero_outputs<1>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<784>, loom::linear<128>, loom::linear<0>, loom::relu, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
