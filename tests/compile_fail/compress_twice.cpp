// SPDX-License-Identifier: Apache-2.0
// compress<> given twice.
// expect: compress<...> is given more than once; keep one
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/data/data_parallel.hpp"

using policy = loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>, loom::compress<loom::fp16>>;

int main() { return static_cast<int>(policy::bucket_cap_bytes > 0); }
