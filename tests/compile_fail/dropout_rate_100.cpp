// SPDX-License-Identifier: Apache-2.0
// Dropout of every element (100 percent), at layer 2.
// expect: loom::dropout_rate<Percent> needs Percent in .0, 100.
// expect: dropout_at_layer_needs_a_rate_below_100_percent<2, 100>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/dropout.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<784>, loom::linear<128>, loom::relu, loom::dropout_rate<100>, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
