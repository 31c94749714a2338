// SPDX-License-Identifier: Apache-2.0
// A pipeline without model_parallel around it is not a policy of the trainer.
// expect: loom::memory_plan<Network, Optimizer, Policy, ...>: Policy must be one of the trainer's
// max-errors: 1
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/memory_plan.hpp"

using net = loom::network<loom::input<784>, loom::linear<64>, loom::relu, loom::linear<10>>;
using plan = loom::memory_plan<net, loom::sgd, loom::pipeline<2>>;

int main() { return static_cast<int>(plan::parameter_bytes); }
