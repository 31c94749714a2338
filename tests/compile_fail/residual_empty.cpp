// SPDX-License-Identifier: Apache-2.0
// A residual with nothing inside, at layer 2.
// expect: loom::residual<...> needs at least one layer inside
// expect: residual_at_layer_has_no_inner_layers<2>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/residual.hpp"

using net = loom::network<loom::input<784>, loom::linear<128>, loom::relu, loom::residual<>, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
