// SPDX-License-Identifier: Apache-2.0
// The GPU side of the CUDA tests: the cases of cases.hpp on loom::cuda, compiled by nvcc, and
// the calls the error-path tests make through the CUDA backend itself.
#include "loom/backend/cuda.hpp"

#define LOOM_TEST_BACKEND loom::cuda
#include "cases_impl.hpp"
#include "cuda_side.hpp"

// loom::cuda runs loom::linear's forward itself and fuses a following ReLU into it (cuBLASLt's
// epilogue): linear_relu_case and mlp_case compare that with loom::cpu's separate passes.
static_assert(loom::detail::can_fuse_relu<loom::linear<24>::impl<loom::shape<40>, float, loom::cuda>>);

LOOM_CUDA_TEST_PASS_CASES(LOOM_CUDA_TEST_INSTANTIATE_PASS)
LOOM_CUDA_TEST_TRAIN_CASES(LOOM_CUDA_TEST_INSTANTIATE_TRAIN)

namespace loom::cuda_tests {

void gemm_with_a_bad_leading_dimension() {
  buffer<float, cuda_space> a(64), b(64), c(64);
  // Row-major A is (4, 8): its leading dimension must be at least 8.
  cuda::gemm(false, false, 4, 8, 8, 1.0f, a.data(), 2, b.data(), 8, 0.0f, c.data(), 8);
}

bool cuda_supports_bf16() { return cuda::supports(math_mode::bf16); }

double sum_on_gpu(const std::vector<float>& values) {
  buffer<float, cuda_space> v;
  to_space(values, v);
  return cuda::sum(values.size(), kernels::as_double<float>{v.data()});
}

}  // namespace loom::cuda_tests
