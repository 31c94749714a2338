// SPDX-License-Identifier: Apache-2.0
// A 3x3 window padded by 2: some windows would hold padding only.
// expect: loom pooling's padding must be at most half its window
// expect: pool2d_padding_larger_than_half_the_window_at_layer<0, 3, 2>
// max-errors: 2
#include "loom/layers/pool2d.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<2, 8, 8>, loom::max_pool2d<3, 2, 2>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
