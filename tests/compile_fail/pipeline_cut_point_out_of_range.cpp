// SPDX-License-Identifier: Apache-2.0
// A cut point past the last layer: the mlp has 5 layers, so a stage cannot start at layer 5.
// expect: loom::cut_at<...>: a cut point is out of range
// expect: cut_point_out_of_range<0, 5, 5>
// max-errors: 2
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/parallel/model_parallel.hpp"

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;
struct no_comm {};
using policy = loom::model_parallel<loom::pipeline<2, loom::cut_at<5>>, no_comm>;

int main() { return static_cast<int>(policy::partition<mlp>::bounds[1]); }
