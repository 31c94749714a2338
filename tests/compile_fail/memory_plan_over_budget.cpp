// SPDX-License-Identifier: Apache-2.0
// The mlp with SGD and momentum needs 7,096,440 bytes at a batch of 512 (3 x 940,584 of
// parameters, gradients and momentum, 8,349 per sample), over a budget of 4,000,000; batches up
// to 141 fit. The compiler prints the comparison, then the marker with rank, batch, bytes needed,
// budget and the largest batch that fits.
// expect: loom::memory_plan: at loom::max_batch<N> a rank needs more bytes than loom::memory_budget<Bytes> allows
// expect: the comparison reduces to .*7096440 <= 4000000
// expect: memory_budget_exceeded_on_rank<0, 512, 7096440, 4000000, 141>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/memory_plan.hpp"

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;
using plan = loom::memory_plan<mlp, loom::sgd, loom::single_process, loom::with_momentum, loom::memory_budget<4'000'000>,
                               loom::max_batch<512>>;

int main() { return static_cast<int>(plan::bytes_per_rank(512) > 0); }
