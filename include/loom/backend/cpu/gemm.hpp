// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-major GEMM on the CPU: C = alpha * op(A) * op(B) + beta * C. float goes to oneDNN's
// sgemm (it picks AVX-512 / AVX2 kernels at run time), or, in math_mode::bf16, to a oneDNN
// bf16 matmul (AMX / AVX512-BF16) on operands rounded to bf16 by a reorder, accumulating and
// writing float. double, used by gradient checks only, runs a plain reference loop.

#include <dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/backend/cpu/dnnl_support.hpp"
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
  static bf16_gemm& this_thread() {
    thread_local bf16_gemm g;
    return g;
  }

  LOOM_DECL void run(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                     std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

  /// Whether oneDNN offers a bf16 matmul on this CPU.
  LOOM_DECL static bool available();

 private:
  struct key {
    bool ta, tb;
    std::size_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    bool operator==(const key&) const = default;
  };
  struct entry {
    key k;
    dnnl::memory::desc a32, a16, b32, b16, c;
    dnnl::reorder ra, rb;
    dnnl::matmul mm;
  };

  LOOM_DECL entry& make(const key& kk);

  std::vector<std::unique_ptr<entry>> entries_;
  buffer<std::uint16_t> a16_, b16_;
};

template <class T>
void cpu_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
              std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc,
              math_mode math = math_mode::fp32) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (math == math_mode::bf16 && k > 0) {
      bf16_gemm::this_thread().run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    signal_shield shield;  // oneDNN's sgemm kernels point the stack pointer into the heap (signals.hpp)
    auto st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m),
                         static_cast<dnnl_dim_t>(n), static_cast<dnnl_dim_t>(k), alpha, a,
                         static_cast<dnnl_dim_t>(lda), b, static_cast<dnnl_dim_t>(ldb), beta, c,
                         static_cast<dnnl_dim_t>(ldc));
    if (st != dnnl_success)
      throw backend_error("loom: oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ") for m=" +
                          std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
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

LOOM_INSTANTIATE(void cpu_gemm<float>(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t,
                                      const float*, std::size_t, float, float*, std::size_t, math_mode))

}  // namespace loom::detail

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/gemm.ipp"
#endif
