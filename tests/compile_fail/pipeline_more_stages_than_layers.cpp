// SPDX-License-Identifier: Apache-2.0
// Six stages for a network of five layers: one stage would have no layer.
// expect: loom::pipeline: more stages than the network has layers
// expect: more_stages_than_layers<6, 5>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/parallel/model_parallel.hpp"

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;
struct no_comm {};
using policy = loom::model_parallel<loom::pipeline<6, loom::micro_batches<8>>, no_comm>;

int main() { return static_cast<int>(policy::partition<mlp>::bounds[1]); }
