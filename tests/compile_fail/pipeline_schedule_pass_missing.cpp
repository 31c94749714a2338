// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule whose stage 1 never runs micro-batch 1's backward.
// expect: a schedule table never runs one pass of a micro-batch on a stage
// expect: schedule_misses_pass_at_stage<1, loom::pipeline_pass::backward, 1>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using short_table = loom::custom_schedule<loom::stage_actions<F(0), F(1), B(0), B(1)>,
                                          loom::stage_actions<F(0), F(1), B(0)>>;

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, short_table>::ok); }
