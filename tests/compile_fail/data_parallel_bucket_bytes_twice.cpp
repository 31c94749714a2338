// SPDX-License-Identifier: Apache-2.0
// bucket_bytes given twice; reported where the bucket size is read (the trainer's engine reads it).
// expect: loom::data_parallel: bucket_bytes<...> is given more than once. keep one
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/data/data_parallel.hpp"

using policy = loom::data_parallel<loom::local_comm, loom::bucket_bytes<1024>, loom::bucket_bytes<2048>>;

int main() { return static_cast<int>(policy::bucket_cap_bytes); }
