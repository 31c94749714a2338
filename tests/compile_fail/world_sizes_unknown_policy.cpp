// SPDX-License-Identifier: Apache-2.0
// A communicator where the policy belongs: the world-size rules list the policies.
// expect: loom::world_size_rules<Network, Policy>: Policy must be one of the trainer's
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/layers/linear.hpp"
#include "loom/parallel/world_sizes.hpp"

using net = loom::network<loom::input<784>, loom::linear<10>>;

int main() { return static_cast<int>(loom::valid_world_sizes<net, loom::local_comm, 64>.size()); }
