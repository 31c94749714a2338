// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule running micro-batch 1's backward before its forward on stage 0 (action 1).
// expect: a schedule table runs a micro-batch's backward before its forward on one stage
// expect: schedule_runs_backward_before_forward_at_stage<0, 1, 1>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using early = loom::custom_schedule<loom::stage_actions<F(0), B(1), F(1), B(0)>,
                                    loom::stage_actions<F(0), F(1), B(0), B(1)>>;

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, early>::ok); }
