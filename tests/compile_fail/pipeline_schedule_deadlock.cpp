// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule that deadlocks: stage 0 waits for the gradient of micro-batch 0
// before it sends micro-batch 1, and stage 1 needs micro-batch 1 before it runs any backward.
// expect: the schedule's sends and receives do not pair up: the stages would wait for each other forever
// expect: schedule_deadlocks_at_stage<0, 1, loom::pipeline_op_kind::recv_gradient, 0>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using stuck = loom::custom_schedule<loom::stage_actions<F(0), B(0), F(1), B(1)>,
                                    loom::stage_actions<F(0), F(1), B(0), B(1)>>;

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, stuck>::ok); }
