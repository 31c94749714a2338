// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-major GEMM on the GPU through cuBLAS: C = alpha op(A) op(B) + beta C. cuBLAS is
// column-major, and a row-major matrix is its transpose seen column-major, so C^T = op(B)^T
// op(A)^T is computed instead: the operands swap places and m and n swap. float runs in full
// FP32 (no TF32: results agree with the CPU's to float rounding), or in math_mode::bf16 on
// bf16 tensor cores: the operands are rounded to compact bf16 copies by a loom kernel (the
// rounding loom::cpu applies), then cublasGemmEx multiplies them with CUBLAS_COMPUTE_32F
// (float accumulation, float C). (CUBLAS_COMPUTE_32F_FAST_16BF on the float data would be one
// call, but it only *allows* bf16: cuBLAS may pick an fp32 kernel for some shapes, so what a
// product computes would depend on its shape.) double in FP64. One cuBLAS handle per thread and
// device, bound to that thread's compute stream. Needs nvcc (it launches the rounding kernel).

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/launch.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/backend/cuda/runtime.hpp"
#include "loom/backend/kernels/bf16.hpp"
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

/// Scratch for the bf16 copies of a product's operands: per thread and device, grown on demand
/// and reused (calls on one stream run one after another). which: 0 for A, 1 for B.
inline std::uint16_t* cuda_bf16_scratch(int which, std::size_t elements) {
  thread_local std::vector<std::unique_ptr<buffer<std::uint16_t, cuda_space>>> per_device[2];
  auto& v = per_device[which];
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= v.size()) v.resize(static_cast<std::size_t>(d) + 1);
  auto& b = v[static_cast<std::size_t>(d)];
  if (!b || b->size() < elements) b = std::make_unique<buffer<std::uint16_t, cuda_space>>(elements);
  return b->data();
}

/// A compact bf16 copy of a stored (rows, cols) float matrix with row stride ld.
inline const std::uint16_t* cuda_to_bf16(int which, const float* src, std::size_t rows, std::size_t cols,
                                         std::size_t ld) {
  std::uint16_t* dst = cuda_bf16_scratch(which, rows * cols);
  cuda_for_each(rows * cols, kernels::round_to_bf16_rows{src, dst, cols, ld});
  return dst;
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
    if (math == math_mode::bf16 && k > 0) {
      // Stored A is (m, k), or (k, m) when transposed; likewise B. The copies are compact.
      const std::size_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
      const std::uint16_t* a16 = cuda_to_bf16(0, a, trans_a ? k : m, a_cols, lda);
      const std::uint16_t* b16 = cuda_to_bf16(1, b, trans_b ? n : k, b_cols, ldb);
      LOOM_CUDA_CHECK(cublasGemmEx_64(cublas_handle(), op_b, op_a, i64(n), i64(m), i64(k), &alpha, b16, CUDA_R_16BF,
                                      i64(b_cols), a16, CUDA_R_16BF, i64(a_cols), &beta, c, CUDA_R_32F, i64(ldc),
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
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
