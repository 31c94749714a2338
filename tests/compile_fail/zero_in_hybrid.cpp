// SPDX-License-Identifier: Apache-2.0
// ZeRO over the replicas of a hybrid, which is not built.
// expect: sharding the optimizer state over the replicas of a hybrid is not built yet; drop shard_optimizer_state
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"

using policy = loom::hybrid<loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>, loom::pipeline<2>>;

int main() { return static_cast<int>(policy::group_size); }
