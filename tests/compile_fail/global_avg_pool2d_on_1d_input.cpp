// SPDX-License-Identifier: Apache-2.0
// Global average pooling averages each channel of an image; a vector has no image.
// expect: loom::global_avg_pool2d needs a 3-D input
// expect: global_avg_pool2d_at_layer_needs_a_3d_input_but_got<1, loom::shape<16>
// max-errors: 2
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<8>, loom::linear<16>, loom::global_avg_pool2d>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
