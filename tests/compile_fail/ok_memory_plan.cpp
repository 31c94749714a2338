// SPDX-License-Identifier: Apache-2.0
// The control of the memory-plan cases: budgets that hold, under every kind of policy, and the
// world sizes of each.
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;
using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu, loom::linear<10>>;
using dp = loom::data_parallel<loom::local_comm>;

using p1 = loom::memory_plan<mlp, loom::sgd, loom::single_process, loom::with_momentum, loom::memory_budget<7'096'440>,
                             loom::max_batch<512>>;
using p2 = loom::memory_plan<mlp, loom::adam, loom::hybrid<dp, loom::pipeline<2, loom::micro_batches<4>>>,
                             loom::max_batch<256>, loom::memory_budget<(16u << 20)>>;
using p3 = loom::memory_plan<tp_mlp, loom::adamw, loom::model_parallel<loom::tensor_parallel<2>, loom::local_comm>,
                             loom::memory_budget<(8u << 20)>, loom::max_batch<64>>;
static_assert(p1::ok && p2::ok && p3::ok);
static_assert(loom::valid_world_sizes<mlp, dp, 64, 16>.size() == 4);
static_assert(loom::valid_world_sizes<tp_mlp, loom::hybrid<dp, loom::tensor_parallel<2>>, 64>.size() == 64);

int main() { return static_cast<int>(p1::bytes_per_rank(512) + p2::bytes_per_rank(256) + p3::bytes_per_rank(64) > 0); }
