// SPDX-License-Identifier: Apache-2.0
// A row_parallel layer whose input (100 features of a whole linear layer) is split 3 ways: 3
// does not divide 100.
// expect: loom::row_parallel: the tensor-parallel width does not divide the layer's input size K
// expect: row_parallel_at_layer_has_inputs_not_divisible_by_width<2, 100, 3>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/parallel/tensor/plan.hpp"
#include "loom/nn/model.hpp"

using net = loom::network<loom::input<784>, loom::linear<100>, loom::relu, loom::row_parallel<loom::linear<10>>>;

int main() {
  loom::model<loom::tensor_parallel_network<net, 3>, float> m(1, 0, loom::tensor_shard{0, 3});
  return static_cast<int>(m.parameters().size());
}
