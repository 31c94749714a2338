// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-major GEMM on the CPU: C = alpha * op(A) * op(B) + beta * C. float goes to oneDNN's
// sgemm (it picks AVX-512 / AVX2 kernels at run time), or, in math_mode::bf16, to a oneDNN
// bf16 matmul (AMX / AVX512-BF16) on operands rounded to bf16 by a reorder, accumulating and
// writing float. double, used by gradient checks only, runs a plain reference loop.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/memory.hpp"

namespace loom::detail {

/// The message for a CPU whose oneDNN has no bf16 matrix product or convolution.
LOOM_DECL std::string cpu_bf16_unsupported(const char* what);

/// C = alpha op(A) op(B) + beta C with A and B rounded to bf16 (to nearest, ties to even) and
/// products summed in float. One matmul primitive and two f32 -> bf16 reorders per call shape,
/// cached per thread; the bf16 copies keep the operands' storage order (a transposed operand
/// becomes a strided matmul argument, not a transposing reorder).
class bf16_gemm {
 public:
  LOOM_DECL static bf16_gemm& this_thread();

  LOOM_DECL void run(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                     std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

  /// Whether oneDNN offers a bf16 matmul on this CPU.
  LOOM_DECL static bool available();

  LOOM_DECL bf16_gemm();
  bf16_gemm(const bf16_gemm&) = delete;
  bf16_gemm& operator=(const bf16_gemm&) = delete;
  LOOM_DECL ~bf16_gemm();

 private:
  struct key {
    bool ta, tb;
    std::size_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    bool operator==(const key&) const = default;
  };
  struct entry;  // the primitives (impl/gemm.ipp)

  LOOM_DECL entry& make(const key& kk);

  std::vector<std::unique_ptr<entry>> entries_;
  buffer<std::uint16_t> a16_, b16_;
};

/// Row-major float C = alpha op(A) op(B) + beta C through oneDNN: its sgemm, or in
/// math_mode::bf16 (k > 0) bf16_gemm. m and n are not 0.
LOOM_DECL void cpu_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                         const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                         std::size_t ldc, math_mode math);

template <class T>
void cpu_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
              std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc,
              math_mode math = math_mode::fp32) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    cpu_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, math);
  } else {
    (void)math;  // double (gradient checks) always computes in double
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        T s = 0;
        for (std::size_t p = 0; p < k; ++p) {
          const T av = trans_a ? a[p * lda + i] : a[i * lda + p];
          const T bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
          s += av * bv;
        }
        c[i * ldc + j] = alpha * s + (beta == T(0) ? T(0) : beta * c[i * ldc + j]);
      }
  }
}

}  // namespace loom::detail

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/gemm.ipp"
#endif
