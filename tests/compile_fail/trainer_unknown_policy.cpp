// SPDX-License-Identifier: Apache-2.0
// A policy the trainer does not take (here a bare loom::tensor_parallel<2>, which goes inside
// loom::model_parallel<..., Comm> or loom::hybrid<...>): one sentence listing the policies.
// expect: loom::trainer: Policy must be loom::single_process, loom::data_parallel<Comm, ...>
// max-errors: 1
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

using net = loom::network<loom::input<8>, loom::linear<4>, loom::relu, loom::linear<2>>;

int main() {
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, loom::tensor_parallel<2>> t;
  return t.steps() == 0 ? 0 : 1;
}
