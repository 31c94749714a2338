// SPDX-License-Identifier: Apache-2.0
// Adam keeps its two moments whatever its options: with_momentum is a mistake, named.
// expect: loom::memory_plan: loom::with_momentum is for an optimizer with a momentum option
// expect: with_momentum_for_an_optimizer_without_momentum<loom::adam>
// max-errors: 2
#include "loom/layers/linear.hpp"
#include "loom/optim/adam.hpp"
#include "loom/parallel/memory_plan.hpp"

using net = loom::network<loom::input<784>, loom::linear<10>>;
using plan = loom::memory_plan<net, loom::adam, loom::single_process, loom::with_momentum>;

int main() { return static_cast<int>(plan::optimizer_state_bytes); }
