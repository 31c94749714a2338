// SPDX-License-Identifier: Apache-2.0
// Two 2 x 2 poolings take a 6 x 6 map to 1 x 1; the third pooling (layer 4) does not fit.
// expect: loom pooling window is larger than its input
// expect: pool2d_window_larger_than_input_at_layer<4, loom::shape<4, 1, 1>, 2>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<1, 6, 6>, loom::conv2d<4, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::max_pool2d<2>, loom::max_pool2d<2>, loom::flatten, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
