// SPDX-License-Identifier: Apache-2.0
// Two schedules.
// expect: loom::pipeline: more than one schedule is given
// max-errors: 1
#include "loom/parallel/pipeline/policy.hpp"

int main() { return static_cast<int>(loom::pipeline<2, loom::gpipe, loom::one_f_one_b>::ok); }
