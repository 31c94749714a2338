// SPDX-License-Identifier: Apache-2.0
// shard_optimizer_state given twice.
// expect: shard_optimizer_state is given more than once; keep one
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/data/data_parallel.hpp"

using policy = loom::data_parallel<loom::local_comm, loom::shard_optimizer_state, loom::shard_optimizer_state>;

int main() { return static_cast<int>(policy::shards_state); }
