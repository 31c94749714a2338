// SPDX-License-Identifier: Apache-2.0
// A type that is not a loom layer in the layer list.
// expect: is not a loom layer
// expect: not_a_loom_layer_at_layer<0, int>
// max-errors: 2
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<4>, int>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
