// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU runtime: one OpenMP thread pool shared by loom's own kernels and oneDNN, its size,
// and flush-to-zero / denormals-are-zero in every thread of it. Not the kernels themselves.

#include <omp.h>
#include <sched.h>

#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>  // _mm_getcsr, _mm_setcsr
#endif

#include "loom/backend/cpu/signals.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom {

namespace detail {
inline void set_flush_denormals_this_thread() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
  // FTZ (bit 15) and DAZ (bit 6) of MXCSR. The mode is per thread: pool threads started
  // earlier do not inherit it, so it is set inside every pool thread, see set_threads().
  _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
}

inline int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n > 0 && n < 1 << 20) ? static_cast<int>(n) : 0;
}

inline int& configured_threads() {
  static int n = 0;
  return n;
}
}  // namespace detail

/// Cores this process may run on (its CPU affinity mask), at least 1.
inline int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return 1;
}

/// Processes of this job on this host, as told by the launcher (Open MPI, MPICH, Slurm); 1 if none.
inline int local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (int n = detail::env_int(name)) return n;
  return 1;
}

/// The default thread count: the cores available divided by the ranks on this host, at least 1.
inline int default_threads() {
  int n = available_cores() / local_ranks();
  return n > 0 ? n : 1;
}

/// Sets the size of the one thread pool (OpenMP, which oneDNN also runs on) and turns on
/// flush-to-zero and denormals-are-zero in every thread of it. The pool's threads other than
/// the caller block asynchronous signals for good (backend/cpu/signals.hpp: oneDNN's kernels
/// must not be interrupted by one); signals sent to the process go to the other threads.
/// n == 0 picks default_threads(). Call it before training; loom::trainer calls it for you.
/// Throws loom::invalid_argument when n is negative.
LOOM_DECL void set_threads(int n = 0);

/// The pool size set by set_threads(), or the OpenMP default before any call.
inline int threads() {
  int n = detail::configured_threads();
  return n ? n : omp_get_max_threads();
}

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/runtime.ipp"
#endif
