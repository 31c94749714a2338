// SPDX-License-Identifier: Apache-2.0
// data_parallel's option given to the plan: named in the marker.
// expect: loom::memory_plan<Network, Optimizer, Policy, Options...>: an option is not one of memory_plan's
// expect: not_a_memory_plan_option<loom::bucket_bytes<1024> >
// max-errors: 2
#include "loom/comm/local.hpp"
#include "loom/layers/linear.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/memory_plan.hpp"

using net = loom::network<loom::input<784>, loom::linear<10>>;
using plan = loom::memory_plan<net, loom::sgd, loom::data_parallel<loom::local_comm>, loom::with_momentum,
                               loom::bucket_bytes<1024>>;

int main() { return static_cast<int>(plan::parameter_bytes); }
