// SPDX-License-Identifier: Apache-2.0
// Synchronized batch norm over a pipeline hybrid's replicas, whose stages run their
// micro-batches at different times on each replica.
// expect: a pipeline's batch norms normalise per micro-batch
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"

using policy = loom::hybrid<loom::data_parallel<loom::local_comm, loom::sync_batch_norm>, loom::pipeline<2>>;

int main() { return static_cast<int>(policy::group_size); }
