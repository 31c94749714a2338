// SPDX-License-Identifier: Apache-2.0
// batch_norm normalises channels of an image (C, H, W) or features of a vector (C); a (4, 6)
// sample is neither.
// expect: loom::batch_norm needs a 1-D input .features. or a 3-D one
// expect: batch_norm_at_layer_needs_a_1d_or_3d_input_but_got<0, loom::shape<4, 6>
// max-errors: 2
#include "loom/layers/batch_norm.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<4, 6>, loom::batch_norm>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
