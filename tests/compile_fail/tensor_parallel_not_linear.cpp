// SPDX-License-Identifier: Apache-2.0
// column_parallel around something other than loom::linear.
// expect: loom::column_parallel<L>: L must be a loom::linear<N, Init>
// max-errors: 1
#include "loom/layers/activation.hpp"
#include "loom/layers/tensor_parallel.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<784>, loom::column_parallel<loom::relu>, loom::linear<10>>;

int main() {
  loom::model<net, float> m(1);
  return static_cast<int>(m.parameters().size());
}
