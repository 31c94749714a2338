// SPDX-License-Identifier: Apache-2.0
#pragma once
// The optimizer half of every engine, written once: a policy's passes (loom::replica_passes,
// loom::pipeline_stages: the model this rank holds, the passes and the policy's communication)
// plus the optimizer state of what this rank holds, the optimizer step (the whole model's
// gradient clipping, ZeRO's sharded step, a hybrid's step commit) and the recovery of the step a
// failure interrupted. loom::replica_engine and loom::pipeline_engine are this over their passes.
// The passes stay free of the optimizer, so that trainers of one network and policy with
// different optimizers share their code.

#include <utility>

#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/step_commit.hpp"

namespace loom::detail {

/// Passes with Optimizer's state (see the file comment). What it asks of Passes:
/// value_type, backend_type, state_count() (values per optimizer buffer: the parameters', or the
/// shard's under ZeRO), local_parameters(), local_gradients(), local_count(), figures(),
/// clip_and_close_step(clip), may_shard_state with shards_state() and sharded_step(state, lr,
/// clip), commits_steps with commits() and world_comm(), and for recovery recoverable,
/// after_recovery() and broadcast_state(buffers, root).
template <class Passes, class Optimizer>
class with_optimizer : public Passes {
 public:
  using typename Passes::value_type;
  using optimizer_state = typename Optimizer::template state<value_type, typename Passes::backend_type>;
  using optimizer_options = typename Optimizer::options;

  /// The passes from `args`, then the optimizer state of what they hold, from `options`
  /// (which throws for bad options).
  template <class... Args>
  explicit with_optimizer(const optimizer_options& options, Args&&... args)
      : Passes(std::forward<Args>(args)...), state_(options, Passes::state_count()) {}

  optimizer_state& optimizer() noexcept { return state_; }

  /// Clips the whole model's gradient norm to clip (0: none) and steps: under ZeRO the shard's
  /// slices; in a hybrid that recovers in the process, after the step's commit over the world.
  void optimizer_step(float lr, double clip) {
    monitor::span span(monitor::span_kind::optimizer);
    if constexpr (Passes::may_shard_state) {
      if (Passes::shards_state()) {
        Passes::sharded_step(state_, lr, clip);
        return;
      }
    }
    Passes::clip_and_close_step(clip);
    if constexpr (Passes::commits_steps)
      if (commit_.enabled() && Passes::commits()) commit_.commit(Passes::world_comm(), lr);  // the step's last collective
    take_step(lr);
  }

  /// Whether this fit commits each step (loom::trainer: where it recovers in the process).
  void set_step_commit(bool on) noexcept { commit_.enable(on); }

  /// After a failure in a hybrid's step commit that completed on another rank: takes the step
  /// from the reduced, clipped gradients this rank holds, and returns true; false when this
  /// rank is not inside a commit.
  bool finish_committed_step() {
    if (!commit_.pending()) return false;
    take_step(*commit_.pending());
    return true;
  }

  /// After a recovery replaced the communicator: the passes' own (fresh buffers, the groups
  /// split again); a commit in flight is given up (the step is redone, or was finished by
  /// finish_committed_step).
  void after_recovery()
    requires Passes::recoverable
  {
    commit_.taken();
    Passes::after_recovery();
  }

  /// The parameters and optimizer buffers of world rank `root` to every rank (a hybrid: of
  /// each place's replica 0 over its replicas, which the recovery brought to one step).
  /// Collective over the world.
  void broadcast_state(int root)
    requires Passes::recoverable
  {
    Passes::broadcast_state(state_.buffers(), root);
  }

 private:
  void take_step(float lr) {
    monitor::timed compute(Passes::figures(), &rank_figures::compute_s);
    state_.step(Passes::local_parameters(), Passes::local_gradients(), Passes::local_count(), lr);
    commit_.taken();
  }

  optimizer_state state_;
  step_commit commit_;
};

}  // namespace loom::detail
