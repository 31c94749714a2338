// SPDX-License-Identifier: Apache-2.0
// An optimizer of one's own that does not say how much state it keeps per parameter.
// expect: loom::memory_plan<Network, Optimizer, ...>: Optimizer must say how much state it keeps per parameter
// max-errors: 1
#include "loom/layers/linear.hpp"
#include "loom/parallel/memory_plan.hpp"

struct my_optimizer {
  struct options {
    float lr = 0.1f;
  };
};
using net = loom::network<loom::input<784>, loom::linear<10>>;
using plan = loom::memory_plan<net, my_optimizer>;

int main() { return static_cast<int>(plan::parameter_bytes); }
