// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-major GEMM on the GPU through cuBLAS: C = alpha op(A) op(B) + beta C. cuBLAS is
// column-major, and a row-major matrix is its transpose seen column-major, so C^T = op(B)^T
// op(A)^T is computed instead: the operands swap places and m and n swap. float runs in full
// FP32 (no TF32: results agree with the CPU's to float rounding), or in math_mode::bf16 on
// bf16 tensor cores (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF: float data in and out,
// operands converted to bf16, float accumulation); double in FP64. One cuBLAS handle per thread
// and device, bound to that thread's compute stream. Host code only.

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/runtime.hpp"
#include "loom/core/math_mode.hpp"

namespace loom::detail {

/// The calling thread's cuBLAS handle on its current device, created on first use.
inline cublasHandle_t cublas_handle() {
  struct handles {
    std::vector<cublasHandle_t> h;
    ~handles() {
      for (cublasHandle_t x : h)
        if (x) (void)cublasDestroy(x);
    }
  };
  thread_local handles hs;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= hs.h.size()) hs.h.resize(static_cast<std::size_t>(d) + 1, nullptr);
  cublasHandle_t& h = hs.h[static_cast<std::size_t>(d)];
  if (!h) {
    LOOM_CUDA_CHECK(cublasCreate(&h));
    LOOM_CUDA_CHECK(cublasSetStream(h, cuda_compute_stream()));
    LOOM_CUDA_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  }
  return h;
}

/// Whether the calling thread's current GPU has bf16 tensor cores (compute capability 8.0 and
/// later: A100, H100/H200, RTX 30xx on). Asked once per device and thread.
inline bool cuda_has_bf16_tensor_cores() {
  thread_local std::vector<signed char> known;  // -1 unknown, 0 no, 1 yes
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= known.size()) known.resize(static_cast<std::size_t>(d) + 1, -1);
  signed char& k = known[static_cast<std::size_t>(d)];
  if (k < 0) {
    int major = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
    k = major >= 8 ? 1 : 0;
  }
  return k == 1;
}

template <class T>
void cuda_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
               std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc,
               math_mode math = math_mode::fp32) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "loom::cuda::gemm: float or double");
  if (m == 0 || n == 0) return;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  if constexpr (std::is_same_v<T, float>) {
    if (math == math_mode::bf16) {
      LOOM_CUDA_CHECK(cublasGemmEx_64(cublas_handle(), op_b, op_a, i64(n), i64(m), i64(k), &alpha, b, CUDA_R_32F, i64(ldb),
                                      a, CUDA_R_32F, i64(lda), &beta, c, CUDA_R_32F, i64(ldc), CUBLAS_COMPUTE_32F_FAST_16BF,
                                      CUBLAS_GEMM_DEFAULT));
      return;
    }
    LOOM_CUDA_CHECK(cublasSgemm_64(cublas_handle(), op_b, op_a, i64(n), i64(m), i64(k), &alpha, b, i64(ldb), a, i64(lda),
                                   &beta, c, i64(ldc)));
  } else {
    (void)math;  // double (gradient checks) always computes in double
    LOOM_CUDA_CHECK(cublasDgemm_64(cublas_handle(), op_b, op_a, i64(n), i64(m), i64(k), &alpha, b, i64(ldb), a, i64(lda),
                                   &beta, c, i64(ldc)));
  }
}

}  // namespace loom::detail
