// SPDX-License-Identifier: Apache-2.0
// Four stages need three cut points; one is given.
// expect: cut_at needs exactly Stages - 1 cut points
// expect: wrong_number_of_cut_points<1, 3>
// max-errors: 2
#include "loom/parallel/pipeline/policy.hpp"

using pipeline_type = loom::pipeline<4, loom::cut_at<2>>;

int main() { return static_cast<int>(pipeline_type::stages); }
