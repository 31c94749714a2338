// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule running micro-batch 0's forward twice on stage 0 (action 1).
// expect: a schedule table runs the same pass of a micro-batch twice on one stage
// expect: schedule_repeats_pass_at_stage<0, 1, loom::pipeline_pass::forward, 0>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using twice = loom::custom_schedule<loom::stage_actions<F(0), F(0), F(1), B(0), B(1)>,
                                    loom::stage_actions<F(0), F(1), B(0), B(1)>>;

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, twice>::ok); }
