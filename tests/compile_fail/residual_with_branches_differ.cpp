// SPDX-License-Identifier: Apache-2.0
// A ResNet block whose main branch halves the image (a stride-2 convolution) but whose shortcut
// does not: Main(x) + Shortcut(x) adds (32, 4, 4) to (32, 8, 8).
// expect: loom::residual_with's main branch and its shortcut end in different shapes
// expect: residual_with_at_layer_adds_branches_of_different_shapes<1, loom::shape<16, 8, 8>, loom::shape<32, 4, 4>, loom::shape<32, 8, 8>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/residual_with.hpp"

using block = loom::residual_with<
    loom::layers<loom::conv2d<32, 3, 2, 1, loom::no_bias>, loom::batch_norm, loom::relu,
                 loom::conv2d<32, 3, 1, 1, loom::no_bias>, loom::batch_norm>,
    loom::shortcut<loom::conv2d<32, 1, 1, 0, loom::no_bias>, loom::batch_norm>>;
using net = loom::network<loom::input<3, 8, 8>, loom::conv2d<16, 3, 1, 1>, block, loom::relu>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
