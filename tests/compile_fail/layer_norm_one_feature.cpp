// SPDX-License-Identifier: Apache-2.0
// layer_norm over a single feature (always normalises to 0).
// expect: loom::layer_norm needs at least two features per sample
// expect: layer_norm_at_layer_has_nothing_to_normalise<1, loom::shape<1>
// max-errors: 2
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<8>, loom::linear<1>, loom::layer_norm>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
