// SPDX-License-Identifier: Apache-2.0
// hybrid over a communicator where its data_parallel<Comm, ...> belongs.
// expect: loom::hybrid<DataParallel, Parallelism>: DataParallel must be loom::data_parallel<Comm, ...>
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"

using policy = loom::hybrid<loom::local_comm, loom::pipeline<2>>;

int main() { return static_cast<int>(policy::group_size); }
