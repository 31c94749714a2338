// SPDX-License-Identifier: Apache-2.0
// micro_batches given twice.
// expect: loom::pipeline: micro_batches<...> is given more than once. keep one
// max-errors: 1
#include "loom/parallel/pipeline/policy.hpp"

int main() { return static_cast<int>(loom::pipeline<2, loom::micro_batches<2>, loom::micro_batches<4>>::ok); }
