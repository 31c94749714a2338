// SPDX-License-Identifier: Apache-2.0
// data_parallel over a type that is not a communicator.
// expect: loom::data_parallel<Comm>: Comm must be a loom communicator
// max-errors: 2
#include "loom/parallel/data/data_parallel.hpp"

struct not_a_comm {};
using policy = loom::data_parallel<not_a_comm>;

int main() { return static_cast<int>(sizeof(policy)); }
