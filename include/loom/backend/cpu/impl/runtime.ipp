// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definition of runtime.hpp's set_threads: included at the end of the header (header-only),
// or compiled once in src/loom.cpp (loom::compiled; loom/core/config.hpp).

#include "loom/backend/cpu/runtime.hpp"

namespace loom {

LOOM_DECL void set_threads(int n) {
  if (n < 0) throw invalid_argument("loom::set_threads: thread count must be >= 0 (0 = automatic), got " + std::to_string(n));
  if (n == 0) n = default_threads();
  omp_set_dynamic(0);
  omp_set_num_threads(n);
  detail::set_flush_denormals_this_thread();
#pragma omp parallel num_threads(n)
  {
    detail::set_flush_denormals_this_thread();
    // The pool's other threads run oneDNN's kernels, which must not take a signal (signals.hpp).
    if (omp_get_thread_num() != 0) detail::shield_this_thread_for_good();
  }
  detail::configured_threads() = n;
}

}  // namespace loom
