// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every test hook of the library, in one place: faults that the tests of tests/fault make
// certain (a hang as a checkpoint begins, a slow disk, a death inside a hybrid's step commit),
// each read from a LOOM_TEST_* environment variable once per process. With none of them set
// (always, outside those tests) every hook returns at once and does nothing.

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "loom/core/fault.hpp"

namespace loom::detail::test_hooks {

/// As a periodic checkpoint begins on this rank (the trainer's checkpoints; tests/fault):
/// - $LOOM_TEST_SLOW_CHECKPOINT_S: rank 0 takes that many seconds more for each periodic
///   checkpoint, as a slow disk would (slow_checkpoint.sh);
/// - $LOOM_TEST_STOP_AT_CHECKPOINT = "K:R": rank R stops itself (SIGSTOP, a hang) as its K-th
///   periodic checkpoint begins, after saying so on stderr with the time (checkpoint_hang.sh).
inline void checkpoint_begins(int rank) {
  struct hooks {
    double slow_s = 0;
    long stop_at = 0, stop_rank = -1;
  };
  static const hooks h = [] {
    hooks r;
    if (const char* v = std::getenv("LOOM_TEST_SLOW_CHECKPOINT_S"); v && *v) r.slow_s = std::strtod(v, nullptr);
    if (const char* v = std::getenv("LOOM_TEST_STOP_AT_CHECKPOINT");
        v && *v && std::sscanf(v, "%ld:%ld", &r.stop_at, &r.stop_rank) != 2)
      r.stop_at = 0;
    return r;
  }();
  static long seen = 0;
  if (rank == 0 && h.slow_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(h.slow_s));
  if (h.stop_at <= 0 || rank != h.stop_rank || ++seen != h.stop_at) return;
  const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "loom: test: rank %d stops itself (SIGSTOP) as checkpoint %ld begins (unix time %.3f)\n", rank,
               h.stop_at, unix_s);
  std::fflush(stderr);
  std::raise(SIGSTOP);
}

/// Once a hybrid's step commit completed on this rank (detail::step_commit):
/// $LOOM_TEST_COMMIT_FAULT = "S:D:L": at step S world rank D dies (SIGKILL) before it steps, and
/// world rank L throws rank_failure as if its commit had failed: L is left a step behind the
/// others, holding the step's reduced gradients — what a death inside the commit's allreduce can
/// leave, made certain (tests/fault/hybrid_recovery.sh).
inline void step_committed(int rank) {
  static const std::array<long, 3> at = [] {
    std::array<long, 3> a{-1, -1, -1};
    if (const char* v = std::getenv("LOOM_TEST_COMMIT_FAULT"); v && *v && std::sscanf(v, "%ld:%ld:%ld", &a[0], &a[1], &a[2]) != 3)
      a = {-1, -1, -1};
    return a;
  }();
  if (at[0] < 0 || static_cast<long>(fault_state.here.step) != at[0]) return;
  if (rank == at[1]) {
    std::fprintf(stderr, "loom: test: rank %d dies (SIGKILL) after the commit of step %ld\n", rank, at[0]);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  if (rank == at[2]) {
    // The commit completed here; the others' completes when their last messages arrive (an
    // allreduce may complete on one rank before another). Wait for that before the roll call
    // this failure starts could interrupt their waits: otherwise no rank has stepped and the
    // step is redone — correct, but not the case this hook is for.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fprintf(stderr, "loom: test: rank %d takes the commit of step %ld for failed\n", rank, at[0]);
    std::fflush(stderr);
    throw rank_failure(rank_failure::kind::deadline, "allreduce", 0.0, -1,
                       "loom: test: the step commit's completion taken for a failure on rank " + std::to_string(rank));
  }
}

}  // namespace loom::detail::test_hooks
