// SPDX-License-Identifier: Apache-2.0
// An option pipeline does not have (int).
// expect: an option is not one of pipeline's
// expect: not_a_pipeline_option<int>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, int>::ok); }
