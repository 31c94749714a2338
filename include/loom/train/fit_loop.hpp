// SPDX-License-Identifier: Apache-2.0
#pragma once
// fit's loop, written and compiled once for every trainer (train/impl/fit_loop.ipp, in
// loom::compiled under separate compilation): epochs of global batches, accumulation groups of
// micro-steps, the loss sums and the optimizer step, then the step observers — failure
// detection's deadlines (train/recovery.hpp), the monitoring (monitor/fit_monitor.hpp), the EMA
// of the weights (train/ema.hpp) and the checkpoints with preemption (train/checkpointing.hpp)
// — and around it all the retries after a recovery. It reaches the engine and the data only
// through their erased interfaces (train/erased_engine.hpp). A new cross-cutting part of fit is
// a new observer (docs/trainer.md, "Observers").

#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"
#include "loom/core/step_observer.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/ema.hpp"
#include "loom/train/erased_engine.hpp"
#include "loom/train/fit_options.hpp"
#include "loom/train/recovery.hpp"
#include "loom/train/run_state.hpp"

namespace loom::detail {

/// Micro-step m of optimizer step s draws its per-sample randomness (dropout) with the salt
/// s * micro_step_salt_stride + m: a prime above any accumulation count, so that no two
/// micro-steps of a run share a salt, and a resumed run computes the same salts as the one that
/// never stopped.
inline constexpr std::uint64_t micro_step_salt_stride = 1'000'003;

/// One fit as loom::trainer::fit hands it over, after its checks and the ranks' agreement on the
/// job: its engine and data, its checkpoints (with the run's state), its options, the training
/// set's size, whether this process replaces a lost rank (`joining`), the seed and the
/// optimizer's base learning rate.
struct fit_job {
  erased_engine& engine;
  erased_loader& data;
  checkpoints ck;
  const fit_options& opts;
  std::size_t samples = 0;
  bool joining = false;
  std::uint64_t seed = 1;
  float base_lr = 0;
};

/// Trains as `job` says (loom::trainer::fit) and returns what it measured.
LOOM_DECL fit_result run_fit(const fit_job& job);

/// The epochs of one fit from `from` (the loop itself): the epochs' results go into r.
LOOM_DECL void train_epochs(const fit_job& job, const fit_position& from, step_observers& observers, fit_result& r);

}  // namespace loom::detail

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/train/impl/fit_loop.ipp"
#endif
