// SPDX-License-Identifier: Apache-2.0
// hybrid of data parallelism and something that is neither a pipeline nor tensor parallelism.
// expect: loom::hybrid<DataParallel, Parallelism>: Parallelism must be loom::pipeline<Stages, ...> or loom::tensor_parallel<Width>
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"

using policy = loom::hybrid<loom::data_parallel<loom::local_comm>, loom::data_parallel<loom::local_comm>>;

int main() { return static_cast<int>(policy::group_size); }
