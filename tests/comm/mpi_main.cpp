// SPDX-License-Identifier: Apache-2.0
// Catch2's main for test_comm_mpi, inside loom::mpi::environment: every process mpirun starts
// runs the same tests (harness.hpp), and the exit code is nonzero when any rank failed. Also
// the checks that only mpi_comm has.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

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

// Under failure detection a blocking collective that a late peer makes time out stays pending
// inside MPI, and the late peer completes it later. Before small operations ran on a heap copy
// (mpi_comm::watched), that late completion wrote into the caller's buffer after the call had
// thrown — in the trainer, a stack buffer reused by the recovery, which then crashed.
TEST_CASE("A watched collective that times out on a late peer never writes its buffer afterwards", "[comm][mpi]") {
  auto world = loom::mpi_comm::world();
  if (world.size() < 2) return;  // no peer to be late
  auto c = world.split(0, world.rank());
  c.watch_for_failures(0.3);
  std::vector<std::uint64_t> v(4, 100 + static_cast<std::uint64_t>(c.rank()));
  const std::vector<std::uint64_t> before = v;
  bool late_done = false;
  if (c.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the others' deadline passes
    try {
      c.allreduce(v.data(), v.size(), loom::reduce_op::sum);  // completes with their pending parts
      late_done = true;
    } catch (const loom::rank_failure&) {
    }
  } else {
    CHECK_THROWS_AS(c.allreduce(v.data(), v.size(), loom::reduce_op::sum), loom::rank_failure);
    CHECK(v == before);
    // MPI progresses the abandoned allreduce while rank 0 takes part, 2 s from now at most.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
    while (std::chrono::steady_clock::now() < until) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(v == before);  // the late completion went to the abandoned copy
  }
  // Whether rank 0's late allreduce finished (so that the others' abandoned one did too).
  int done = late_done ? 1 : 0;
  world.allreduce(&done, 1, loom::reduce_op::max);
  if (c.rank() == 0 && done) {
    const auto n = static_cast<std::uint64_t>(c.size());
    CHECK(v == std::vector<std::uint64_t>(4, 100 * n + n * (n - 1) / 2));
  }
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
