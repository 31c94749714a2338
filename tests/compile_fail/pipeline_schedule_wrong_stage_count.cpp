// SPDX-License-Identifier: Apache-2.0
// A hand-written schedule with one stage table for a pipeline of two stages.
// expect: loom::custom_schedule: the schedule has a different number of stage tables than the pipeline has stages
// expect: custom_schedule_has_wrong_number_of_stages<1, 2>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;
using one_table = loom::custom_schedule<loom::stage_actions<F(0), B(0)>>;

int main() { return static_cast<int>(loom::pipeline<2, one_table>::ok); }
