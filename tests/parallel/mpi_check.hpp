// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the programs CTest runs under mpirun share: check() counts a failed expectation on this
// rank and says which; finish() sums the failures over all ranks, and rank 0 prints "all checks
// passed" (what CTest looks for) or how many failed. The exit status is non-zero on every rank
// when any check failed anywhere.

#include <cstdio>
#include <string>

#include "loom/comm/mpi.hpp"

namespace loom_test {

inline int failures = 0;

inline void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "rank %d: FAILED: %s\n", loom::mpi_comm::world().rank(), what.c_str());
  }
}

/// Collective over comm.
inline int finish(loom::mpi_comm& comm) {
  int total = failures;
  comm.allreduce(&total, 1, loom::reduce_op::sum);
  if (comm.rank() == 0) {
    if (total == 0) std::printf("all checks passed\n");
    else std::printf("%d checks failed over all ranks\n", total);
  }
  return total == 0 ? 0 : 1;
}

}  // namespace loom_test
