// SPDX-License-Identifier: Apache-2.0
#pragma once
// Calls into loom::cuda that the Catch2 tests (compiled by g++) make through cuda_side.cu.

#include <vector>

namespace loom::cuda_tests {

/// loom::cuda::gemm with lda below the row length: cuBLAS rejects it.
void gemm_with_a_bad_leading_dimension();

/// loom::cuda::supports(math_mode::bf16) on the current GPU.
bool cuda_supports_bf16();

/// loom::cuda::sum of the values, copied to the GPU.
double sum_on_gpu(const std::vector<float>& values);

}  // namespace loom::cuda_tests
