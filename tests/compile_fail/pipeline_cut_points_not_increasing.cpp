// SPDX-License-Identifier: Apache-2.0
// Cut points out of order: stage 1 would start at layer 3 and stage 2 at layer 2.
// expect: loom::cut_at<...>: the cut points must be strictly increasing
// expect: cut_points_not_increasing<1, 3, 2>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

using pipeline_type = loom::pipeline<3, loom::cut_at<3, 2>>;

int main() { return static_cast<int>(pipeline_type::stages); }
