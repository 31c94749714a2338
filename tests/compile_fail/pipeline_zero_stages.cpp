// SPDX-License-Identifier: Apache-2.0
// A pipeline of no stages.
// expect: loom::pipeline<Stages, ...>: a pipeline needs at least one stage
// max-errors: 1
#include "loom/parallel/pipeline/policy.hpp"

int main() { return static_cast<int>(loom::pipeline<0>::ok); }
