// SPDX-License-Identifier: Apache-2.0
// Pooling after flatten (layer 2), where the map is already a vector.
// expect: loom pooling \(max_pool2d / avg_pool2d\) needs a 3-D input
// expect: pool2d_at_layer_needs_a_3d_input_but_got<2, loom::shape<16>
// max-errors: 2
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<1, 4, 4>, loom::conv2d<1, 3, 1, 1>, loom::flatten, loom::avg_pool2d<2>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
