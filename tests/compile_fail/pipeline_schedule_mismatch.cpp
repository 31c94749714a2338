// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule whose sends and receives do not pair up: stage 0 sends micro-batch 0
// first, but stage 1 starts with micro-batch 1.
// expect: the schedule's sends and receives do not pair up: a stage sends one micro-batch
// expect: schedule_send_does_not_match_receive_at_stage<0, 0, loom::pipeline_op_kind::send_activation, 0, 1, 1>
// max-errors: 2
#include "loom/parallel/model_parallel.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using crossed = loom::custom_schedule<loom::stage_actions<F(0), F(1), B(1), B(0)>,
                                      loom::stage_actions<F(1), F(0), B(1), B(0)>>;
struct no_comm {};
using policy = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>, crossed>, no_comm>;

int main() { return static_cast<int>(policy::stages); }
