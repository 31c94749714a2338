// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-major GEMM on the CPU: C = alpha * op(A) * op(B) + beta * C. float goes to oneDNN's
// sgemm (it picks AVX-512 / AVX2 kernels at run time); double, used by gradient checks only,
// runs a plain reference loop.

#include <dnnl.hpp>

#include <cstddef>
#include <string>

#include "loom/core/error.hpp"

namespace loom::detail {

template <class T>
void cpu_gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
              std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    auto st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m),
                         static_cast<dnnl_dim_t>(n), static_cast<dnnl_dim_t>(k), alpha, a,
                         static_cast<dnnl_dim_t>(lda), b, static_cast<dnnl_dim_t>(ldb), beta, c,
                         static_cast<dnnl_dim_t>(ldc));
    if (st != dnnl_success)
      throw backend_error("loom: oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ") for m=" +
                          std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  } else {
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
