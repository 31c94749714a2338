// SPDX-License-Identifier: Apache-2.0
// Catch2's main for test_comm_mpi, inside loom::mpi::environment: every process mpirun starts
// runs the same tests (harness.hpp), and the exit code is nonzero when any rank failed. Also
// the checks that only mpi_comm has.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <climits>
#include <cstdio>

#include "loom/comm/mpi.hpp"

TEST_CASE("mpi_comm rejects a max_count outside [1, INT_MAX] and a negative colour on every rank", "[comm][mpi]") {
  auto world = loom::mpi_comm::world();
  CHECK(world.max_count() == static_cast<std::size_t>(INT_MAX));
  CHECK(world.with_max_count(10).max_count() == 10);
  CHECK_THROWS_AS(world.with_max_count(0), loom::invalid_argument);
  CHECK_THROWS_AS(world.with_max_count(static_cast<std::size_t>(INT_MAX) + 1), loom::invalid_argument);
  CHECK_THROWS_WITH(world.split(-2, 0), Catch::Contains("split") && Catch::Contains("colour"));
  world.barrier();
}

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto world = loom::mpi_comm::world();
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run() != 0 ? 1 : 0;
  // The job fails when any rank failed, whichever rank mpirun reports.
  const int mine = failed;
  world.allreduce(&failed, 1, loom::reduce_op::max);
  if (failed && !mine) std::fprintf(stderr, "test_comm_mpi: rank %d passed, but another rank failed\n", world.rank());
  return failed;
}
