// SPDX-License-Identifier: Apache-2.0
#pragma once
// The step commit of a hybrid's engines where the fit recovers in the process
// (docs/fault-tolerance.md, "Hybrids"): the slices or stages of one model replica step separately, each after its own
// data-parallel group's gradient allreduce, so a failure could leave one part of a surviving
// replica stepped and another not. Every rank therefore joins one 8-byte allreduce over the
// world after every collective of its step and before its parameters change; if it completed
// on any rank, every rank holds the step's reduced, clipped gradients, and a survivor left a
// step behind takes the step in the recovery (finish_committed_step). Used by
// loom::replica_engine (tensor-parallel hybrids) and loom::pipeline_engine (pipeline hybrids).

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "loom/comm/communicator.hpp"
#include "loom/core/fault.hpp"

namespace loom::detail {

/// Test hook, $LOOM_TEST_COMMIT_FAULT = "S:D:L": at step S, once the step commit completed,
/// world rank D dies (SIGKILL) before it steps, and world rank L throws rank_failure as if its
/// commit had failed: L is left a step behind the others, holding the step's reduced gradients
/// — what a death inside the commit's allreduce can leave, made certain
/// (tests/fault/hybrid_recovery.sh).
inline void commit_hook_for_tests(int rank) {
  static const std::array<long, 3> at = [] {
    std::array<long, 3> a{-1, -1, -1};
    if (const char* v = std::getenv("LOOM_TEST_COMMIT_FAULT"); v && *v && std::sscanf(v, "%ld:%ld:%ld", &a[0], &a[1], &a[2]) != 3)
      a = {-1, -1, -1};
    return a;
  }();
  if (at[0] < 0 || static_cast<long>(fault_here.step) != at[0]) return;
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

/// The step commit of one engine: commit() runs it over the world and remembers the step's
/// learning rate until the step is taken (taken()); pending() is that rate while a commit is
/// in flight or failed. enabled(): whether this fit recovers in the process (the trainer says;
/// where a failure ends the job, as under plain mpirun, a commit would buy nothing).
class step_commit {
 public:
  void enable(bool on) noexcept { on_ = on; }
  bool enabled() const noexcept { return on_; }
  template <class Comm>
  void commit(Comm& world, float lr) {
    lr_ = lr;
    set_phase(fault_phase::step_commit);
    std::uint64_t one = 1;
    world.allreduce(&one, 1, reduce_op::max);
    commit_hook_for_tests(world.rank());
    set_phase(fault_phase::optimizer);
  }
  const std::optional<float>& pending() const noexcept { return lr_; }
  void taken() noexcept { lr_.reset(); }

 private:
  std::optional<float> lr_;
  bool on_ = false;
};

}  // namespace loom::detail
