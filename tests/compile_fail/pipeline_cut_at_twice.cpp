// SPDX-License-Identifier: Apache-2.0
// cut_at given twice.
// expect: loom::pipeline: cut_at<...> is given more than once. keep one
// max-errors: 1
#include "loom/parallel/pipeline/policy.hpp"

int main() { return static_cast<int>(loom::pipeline<2, loom::cut_at<2>, loom::cut_at<3>>::ok); }
