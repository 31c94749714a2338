// SPDX-License-Identifier: Apache-2.0
// model_parallel of something that is neither a pipeline nor tensor parallelism.
// expect: loom::model_parallel<Parallelism, Comm>: Parallelism must be loom::pipeline<Stages, Options...> or loom::tensor_parallel<Width>
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/model_parallel.hpp"

using policy = loom::model_parallel<loom::micro_batches<4>, loom::local_comm>;

int main() { return static_cast<int>(policy::group_size); }
