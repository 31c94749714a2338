// SPDX-License-Identifier: Apache-2.0
// A budget without the batch to check it at.
// expect: loom::memory_plan: loom::memory_budget<Bytes> is checked at a batch: add loom::max_batch<N>
// expect: memory_budget_without_max_batch<1000000>
// max-errors: 2
#include "loom/layers/linear.hpp"
#include "loom/optim/adam.hpp"
#include "loom/parallel/memory_plan.hpp"

using net = loom::network<loom::input<784>, loom::linear<10>>;
using plan = loom::memory_plan<net, loom::adam, loom::single_process, loom::memory_budget<1'000'000>>;

int main() { return static_cast<int>(plan::parameter_bytes); }
