// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU launcher: runs a LOOM_HD kernel body f(i) for i in [0, n), threaded when the work
// is large enough to pay for waking the pool. The CUDA launcher runs the same bodies.

#include <omp.h>

#include <cstddef>

namespace loom::detail {

/// Below this many elements a loop stays on the calling thread.
inline constexpr std::size_t parallel_threshold = 1 << 15;

template <class F>
void cpu_for_each(std::size_t n, F f) {
  // Iterations of a kernel body are independent by contract, so the loops are marked simd:
  // the compiler vectorises them without proving that the body's pointers do not alias. No
  // reduction is involved, so the results are the same as a scalar loop's, bit for bit.
  const F body = f;
  if (n < parallel_threshold || omp_get_max_threads() == 1) {
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) body(i);
    return;
  }
  const auto sn = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for simd schedule(static)
  for (std::ptrdiff_t i = 0; i < sn; ++i) body(static_cast<std::size_t>(i));
}

/// Sum of f(i) over [0, n) in double. Deterministic for a given thread count (static schedule,
/// per-thread partial sums added in thread order).
template <class F>
double cpu_sum(std::size_t n, F f) {
  const int nt = omp_get_max_threads();
  if (n < parallel_threshold || nt == 1) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(f(i));
    return s;
  }
  double partial[256] = {};
  const int used = nt < 256 ? nt : 256;
#pragma omp parallel num_threads(used)
  {
    const int t = omp_get_thread_num();
    const int team = omp_get_num_threads();
    const std::size_t lo = n * static_cast<std::size_t>(t) / static_cast<std::size_t>(team);
    const std::size_t hi = n * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(team);
    double s = 0;
    for (std::size_t i = lo; i < hi; ++i) s += static_cast<double>(f(i));
    partial[t] = s;
  }
  double s = 0;
  for (int t = 0; t < used; ++t) s += partial[t];
  return s;
}

}  // namespace loom::detail
