// SPDX-License-Identifier: Apache-2.0
// An option data_parallel does not have (int).
// expect: an option is not one of data_parallel's \(bucket_bytes<N>, compress<bf16>, compress<fp16>, shard_optimizer_state, sync_batch_norm, choose_at_run_time\)
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/data/data_parallel.hpp"

using policy = loom::data_parallel<loom::local_comm, int>;

int main() { return static_cast<int>(sizeof(policy)); }
