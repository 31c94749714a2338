// SPDX-License-Identifier: Apache-2.0
// A pipeline whose first stage fits the budget and whose second does not: the marker names
// stage 1. Cut after the 16-wide layer, GPipe over 4 micro-batches: at a batch of 64, stage 0
// needs 317,568 bytes and stage 1 2,553,312 (55,306 parameters and their gradients, 442,448;
// 4 live micro-batches of 16 samples, 131,913 bytes per sample; 64 labels), against 1,000,000;
// stage 1 fits up to a batch of 16.
// expect: loom::memory_plan: at loom::max_batch<N> a rank needs more bytes than loom::memory_budget<Bytes> allows
// expect: the comparison reduces to .*2553312 <= 1000000
// expect: memory_budget_exceeded_on_rank<1, 64, 2553312, 1000000, 16>
// max-errors: 2
#include "loom/comm/local.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/memory_plan.hpp"

using net = loom::network<loom::input<784>, loom::linear<16>, loom::relu, loom::linear<2048>, loom::relu, loom::linear<10>>;
using policy = loom::model_parallel<loom::pipeline<2, loom::cut_at<2>, loom::micro_batches<4>, loom::gpipe>, loom::local_comm>;
using plan = loom::memory_plan<net, loom::sgd, policy, loom::memory_budget<1'000'000>, loom::max_batch<64>>;

int main() { return static_cast<int>(plan::for_rank(0).bytes(64) > 0); }
