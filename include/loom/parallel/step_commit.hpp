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

#include <cstdint>
#include <optional>

#include "loom/comm/communicator.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/test_hooks.hpp"

namespace loom::detail {

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
    test_hooks::step_committed(world.rank());
    set_phase(fault_phase::optimizer);
  }
  const std::optional<float>& pending() const noexcept { return lr_; }
  void taken() noexcept { lr_.reset(); }

 private:
  std::optional<float> lr_;
  bool on_ = false;
};

}  // namespace loom::detail
