// SPDX-License-Identifier: Apache-2.0
// The control of the tensor-parallel cases: the same networks with widths that divide.
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"

using net = loom::network<loom::input<784>, loom::column_parallel<loom::linear<99>>, loom::relu,
                          loom::row_parallel<loom::linear<10>>>;
using whole_then_row = loom::network<loom::input<784>, loom::linear<99>, loom::relu, loom::row_parallel<loom::linear<10>>>;
using policy = loom::model_parallel<loom::tensor_parallel<3>, loom::local_comm>;

int main() {
  loom::model<loom::tensor_parallel_network<whole_then_row, 3>, float> m(1, 0, loom::tensor_shard{0, 3});
  loom::local_world(3).run([](loom::local_comm& c) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy> t{c};
    (void)t;
  });
  return static_cast<int>(m.parameters().size());
}
