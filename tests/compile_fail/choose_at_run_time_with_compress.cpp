// SPDX-License-Identifier: Apache-2.0
// choose_at_run_time beside an option it chooses (compress<>): one or the other.
// expect: drop compress<>, shard_optimizer_state and sync_batch_norm from the policy
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/data/data_parallel.hpp"

using policy = loom::data_parallel<loom::local_comm, loom::choose_at_run_time, loom::compress<loom::bf16>>;

int main() { return static_cast<int>(policy::bucket_cap_bytes > 0); }
