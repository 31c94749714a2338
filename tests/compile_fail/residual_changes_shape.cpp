// SPDX-License-Identifier: Apache-2.0
// A residual whose inner stack maps 16 features to 8: x + F(x) has no meaning.
// expect: loom::residual's inner layers change the shape
// expect: residual_at_layer_changes_the_shape<1, loom::shape<16>, loom::shape<8>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<32>, loom::linear<16>, loom::residual<loom::linear<8>, loom::relu>, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
