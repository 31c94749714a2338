// SPDX-License-Identifier: Apache-2.0
// compress<> of a type that is not a 16-bit wire float.
// expect: loom::compress<H>: H must be loom::bf16 or loom::fp16
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/data/data_parallel.hpp"

using policy = loom::data_parallel<loom::local_comm, loom::compress<double>>;

int main() { return static_cast<int>(sizeof(policy::wire_type)); }
