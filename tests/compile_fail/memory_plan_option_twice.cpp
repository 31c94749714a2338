// SPDX-License-Identifier: Apache-2.0
// max_batch given twice.
// expect: loom::memory_plan: an option is given more than once
// max-errors: 1
#include "loom/layers/linear.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/memory_plan.hpp"

using net = loom::network<loom::input<784>, loom::linear<10>>;
using plan = loom::memory_plan<net, loom::sgd, loom::single_process, loom::memory_budget<1'000'000>, loom::max_batch<64>,
                               loom::max_batch<128>>;

int main() { return static_cast<int>(plan::parameter_bytes); }
