// SPDX-License-Identifier: Apache-2.0
#pragma once
// What fit's loop (loom/train/fit_loop.hpp) tells the rest of the run as it goes: the loss sums
// of a run of steps, where the fit is after each optimizer step (step_point), and the
// interface of a step observer — checkpointing and preemption (train/checkpointing.hpp),
// monitoring (monitor/fit_monitor.hpp), the deadlines of failure detection (train/recovery.hpp).
// A cross-cutting feature of fit is one more observer, not more lines in the loop
// (docs/trainer.md, "Observers"). In core/ so that any folder can write one.

#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <vector>

namespace loom {

/// The loss sums of some samples: the loss summed over them, the correct predictions and the
/// samples themselves (doubles: they are summed over the replicas).
struct loss_sums {
  double loss = 0, correct = 0, samples = 0;

  loss_sums& operator+=(const loss_sums& o) noexcept {
    loss += o.loss;
    correct += o.correct;
    samples += o.samples;
    return *this;
  }
  double mean_loss() const noexcept { return samples ? loss / samples : 0; }
  double accuracy() const noexcept { return samples ? correct / samples : 0; }
};

/// An epoch fit is about to run (step_observer::epoch_begins).
struct epoch_start {
  std::size_t epoch = 0;        ///< from 0
  std::size_t first_batch = 0;  ///< the global batch it starts at (a resumed epoch: not 0)
  std::size_t batches = 0;      ///< global batches per epoch
  std::size_t step = 0;         ///< optimizer steps taken so far, over every fit
};

/// Where fit is after an optimizer step (step_observer::after_step).
struct step_point {
  using clock = std::chrono::steady_clock;
  std::size_t step = 0;      ///< optimizer steps taken so far, over every fit (this one included)
  std::size_t epoch = 0;     ///< the epoch in progress, from 0
  std::size_t batch = 0;     ///< global batches of it taken
  std::size_t batches = 0;   ///< global batches per epoch
  loss_sums epoch_sums{};    ///< this epoch's so far: this rank's replica's, or the whole batch's
  float lr = 0;              ///< this step's learning rate
  std::size_t samples = 0;   ///< this rank's samples in this step
  std::size_t trained = 0;   ///< global samples this fit has trained, this step's included
  clock::time_point started{}, ended{};  ///< this step's first micro-step and its end
};

/// One cross-cutting part of fit, told where the loop is. The loop calls every observer in the
/// order they were added — the same on every rank, so that observers may run collectives.
class step_observer {
 public:
  virtual void epoch_begins(const epoch_start&) {}
  /// Before step `step`'s first micro-step.
  virtual void step_begins(std::size_t /*step*/) {}
  /// After the optimizer step and the loop's bookkeeping; false asks fit to stop after this step
  /// (a preemption's checkpoint is committed).
  virtual bool after_step(const step_point& p) = 0;
  /// The survivors of a failed rank go on (train/recovery.hpp): the world has changed.
  virtual void after_recovery() {}

 protected:
  ~step_observer() = default;
};

/// The observers of one fit, in order.
class step_observers {
 public:
  step_observers(std::initializer_list<step_observer*> all) : all_(all) {}
  void add(step_observer& o) { all_.push_back(&o); }
  void epoch_begins(const epoch_start& e) {
    for (step_observer* o : all_) o->epoch_begins(e);
  }
  void step_begins(std::size_t step) {
    for (step_observer* o : all_) o->step_begins(step);
  }
  /// Every observer sees the step; false when any asked to stop.
  bool after_step(const step_point& p) {
    bool go_on = true;
    for (step_observer* o : all_) go_on = o->after_step(p) && go_on;
    return go_on;
  }
  void after_recovery() {
    for (step_observer* o : all_) o->after_recovery();
  }

 private:
  std::vector<step_observer*> all_;
};

}  // namespace loom
