// SPDX-License-Identifier: Apache-2.0
// The run-time choice of the wire format and ZeRO inside a hybrid, which is not built.
// expect: the run-time choice of the wire format and ZeRO is built for plain loom::data_parallel only
// max-errors: 1
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"

using policy = loom::hybrid<loom::data_parallel<loom::local_comm, loom::choose_at_run_time>, loom::pipeline<2>>;

int main() { return static_cast<int>(policy::group_size); }
