// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule naming micro-batch 2 of a step of 2 (0 and 1): stage 0, action 1.
// expect: a schedule table names a micro-batch outside .0, M.
// expect: schedule_micro_batch_out_of_range_at_stage<0, 1, 2, 2>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using past_the_end = loom::custom_schedule<loom::stage_actions<F(0), F(2), B(2), B(0)>,
                                           loom::stage_actions<F(0), F(2), B(2), B(0)>>;

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, past_the_end>::ok); }
