// SPDX-License-Identifier: Apache-2.0
// Catch2's main for test_comm_mpi, inside loom::mpi::environment: every process mpirun starts
// runs the same tests (harness.hpp), and the exit code is nonzero when any rank failed. Also
// the checks that only mpi_comm has.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>
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
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // the others' deadline (0.3 s) passes
    try {
      c.allreduce(v.data(), v.size(), loom::reduce_op::sum);  // completes with their pending parts
      late_done = true;
    } catch (const loom::rank_failure&) {
    }
  } else {
    CHECK_THROWS_AS(c.allreduce(v.data(), v.size(), loom::reduce_op::sum), loom::rank_failure);
    CHECK(v == before);
    // MPI progresses the abandoned allreduce while rank 0 takes part, 3 s from now at most.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3000);
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

// mpi_comm::watch_as_part_of: a communicator split from a watched one keeps the whole's
// deadline, reports its operations to the whole's roll call and breaks the whole on a failure
// (a pipeline's stages, a tensor group: loom::trainer's failure detection where no recovery is
// possible).
TEST_CASE("A communicator watched as part of a whole keeps its deadline and reports to its roll call", "[comm][mpi]") {
  auto world = loom::mpi_comm::world();
  auto whole = world.split(0, world.rank());
  auto part = whole.split(0, whole.rank());
  CHECK_THROWS_WITH(part.watch_as_part_of(whole), Catch::Contains("no failure detector"));
  if (world.size() < 2) return;  // no peer to be late
  whole.watch_for_failures(0.3);
  part.watch_as_part_of(whole);
  REQUIRE(part.watch() != nullptr);
  CHECK(part.watch()->whole.get() == whole.watch());
  CHECK(part.watch()->peers.size() == static_cast<std::size_t>(part.size()));
  std::uint64_t v = 1;
  part.allreduce(&v, 1, loom::reduce_op::sum);
  CHECK(v == static_cast<std::uint64_t>(part.size()));
  CHECK(std::string(whole.watch()->last_op) == "allreduce");  // the part's operation, on the whole's record
  if (part.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    try {
      part.barrier();
    } catch (const loom::rank_failure&) {
    }
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      part.barrier();
      FAIL("the barrier finished although rank 0 came 3 s late and the deadline was 0.3 s");
    } catch (const loom::rank_failure& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CHECK(e.why() == loom::rank_failure::kind::deadline);
      CHECK(waited < 2.5);  // the whole's 0.3 s (and some scheduling), not the 60 s default
      CHECK(whole.watch()->broken);
    }
  }
  world.barrier();
}

// Open MPI 4.1.4 leaves SIGPIPE's default action (terminate) in MPI processes, and its TCP
// transport sends with writev(): a survivor sending to a peer that just died was killed by
// SIGPIPE (status 141) on the 2-host harness. Failure detection ignores SIGPIPE, so such a
// write fails with EPIPE and the detector handles the dead peer; a program's own handler stays.
namespace {
volatile sig_atomic_t program_pipe_handler_ran = 0;
void program_pipe_handler(int) { program_pipe_handler_ran = 1; }
}  // namespace

TEST_CASE("Failure detection turns a write to a dead peer's connection into EPIPE, not the end of the process",
          "[comm][mpi]") {
  auto world = loom::mpi_comm::world();
  struct sigaction dfl {}, now {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  REQUIRE(::sigaction(SIGPIPE, &dfl, nullptr) == 0);
  auto c = world.split(0, world.rank());
  c.watch_for_failures(5.0);
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_IGN);
  // A connection whose other end is gone, as a dead peer's: the write fails, this process lives.
  int sv[2] = {-1, -1};
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ::close(sv[1]);
  const char byte = 1;
  errno = 0;
  CHECK(::write(sv[0], &byte, 1) == -1);
  CHECK(errno == EPIPE);
  ::close(sv[0]);
  // A program that handles SIGPIPE itself keeps its handler.
  struct sigaction mine {};
  mine.sa_handler = program_pipe_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(::sigaction(SIGPIPE, &mine, nullptr) == 0);
  CHECK_FALSE(loom::detail::ignore_broken_pipes());
  auto d = world.split(0, world.rank());
  d.watch_for_failures(5.0);
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == program_pipe_handler);
  ::raise(SIGPIPE);
  CHECK(program_pipe_handler_ran == 1);
  // Back to what the suite runs with.
  REQUIRE(::sigaction(SIGPIPE, &dfl, nullptr) == 0);
  CHECK(loom::detail::ignore_broken_pipes());
  world.barrier();
}

// Under failure detection, MPI refusing to start an operation is a failed peer's doing (Open MPI
// 4.1's TCP transport refuses a send to a peer whose socket write failed with MPI_ERR_INTERN):
// rank_failure, as an error in a wait, so that the trainer recovers. An error of the caller's
// own arguments stays a communication_error, which no recovery would cure.
TEST_CASE("Under failure detection an operation MPI refuses to start is a rank_failure unless its arguments were wrong",
          "[comm][mpi]") {
  CHECK(loom::detail::mpi_argument_error(MPI_ERR_TAG));
  CHECK(loom::detail::mpi_argument_error(MPI_ERR_COUNT));
  CHECK_FALSE(loom::detail::mpi_argument_error(MPI_ERR_INTERN));
  CHECK_FALSE(loom::detail::mpi_argument_error(MPI_ERR_OTHER));
  auto world = loom::mpi_comm::world();
  auto c = world.split(0, world.rank());
  c.watch_for_failures(5.0);
  int* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  REQUIRE(found);
  float v = 1;
  // A tag above MPI_TAG_UB (or a negative one): MPI_Isend refuses it (MPI_ERR_TAG); the
  // communicator stays usable.
  const int bad_tag = *ub < INT_MAX ? *ub + 1 : -5;
  bool refused = false;
  try {
    (void)c.isend(&v, 1, c.rank(), bad_tag);
  } catch (const loom::rank_failure&) {
    FAIL("a wrong tag was taken for a failed peer");
  } catch (const loom::communication_error& e) {
    refused = true;
    CHECK_THAT(e.what(), Catch::Contains("isend"));
  }
  CHECK(refused);
  CHECK_FALSE(c.watch()->broken);
  c.allreduce(&v, 1, loom::reduce_op::sum);
  CHECK(v == static_cast<float>(c.size()));
  // A refusal for any other reason (here: as Open MPI's TCP transport gives after EPIPE).
  try {
    c.watch()->refused("isend", c.rank(), MPI_ERR_INTERN);
    FAIL("refused returned");
  } catch (const loom::rank_failure& e) {
    CHECK(e.why() == loom::rank_failure::kind::mpi_error);
    CHECK_THAT(e.what(), Catch::Contains("MPI refused to start it") && Catch::Contains("isend"));
  }
  CHECK(c.watch()->broken);
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
