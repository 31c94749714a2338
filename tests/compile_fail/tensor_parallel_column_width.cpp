// SPDX-License-Identifier: Apache-2.0
// A column_parallel layer of 100 outputs split 3 ways: 3 does not divide 100.
// expect: loom::column_parallel: the tensor-parallel width does not divide the layer's outputs N
// expect: column_parallel_at_layer_has_outputs_not_divisible_by_width<0, 100, 3>
// max-errors: 2
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"

using net = loom::network<loom::input<784>, loom::column_parallel<loom::linear<100>>, loom::relu,
                          loom::row_parallel<loom::linear<10>>>;
using policy = loom::model_parallel<loom::tensor_parallel<3>, loom::local_comm>;

int main() {
  loom::local_world(3).run([](loom::local_comm& c) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy> t{c};
    (void)t;
  });
}
