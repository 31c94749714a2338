// SPDX-License-Identifier: Apache-2.0
// A trainer of a pipeline whose hand-written schedule deadlocks. The trainer compiles its code
// once per stage cut (detail::code_policy_t leaves the micro-batch count and the schedule out),
// so this pins that it still verifies the schedule the user named, at compile time.
// expect: the schedule's sends and receives do not pair up: the stages would wait for each other forever
// expect: schedule_deadlocks_at_stage<0, 1, loom::pipeline_op_kind::recv_gradient, 0>
// max-errors: 2
#include "loom/comm/local.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using stuck = loom::custom_schedule<loom::stage_actions<F(0), B(0), F(1), B(1)>,
                                    loom::stage_actions<F(0), F(1), B(0), B(1)>>;
using net = loom::network<loom::input<8>, loom::linear<4>, loom::relu, loom::linear<2>>;
using policy = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>, stuck>, loom::local_comm>;

int main() {
  loom::local_world(2).run([](loom::local_comm c) { loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy> t{c}; });
}
