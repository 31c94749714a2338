// SPDX-License-Identifier: Apache-2.0
#pragma once
// A trainer's checkpoints (docs/checkpoints.md), written once for every trainer: the record of
// the run and the snapshot of this rank's state in host memory, their save, the load with its
// resume checks, and the emergency checkpoint of a survivor when no recovery is possible
// (detail::checkpoints, over the erased engine); and, over a fit, their schedule as a step
// observer — a checkpoint every N steps or seconds, preemption by SIGUSR1 / SIGTERM (finish the
// step, commit a checkpoint, stop), the checkpoint at the fit's end (detail::checkpoint_schedule).

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/step_observer.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/train/erased_engine.hpp"
#include "loom/train/fit_options.hpp"
#include "loom/train/recovery.hpp"
#include "loom/train/run_state.hpp"

namespace loom::detail {

/// Whether loomrun (bin/loomrun) restarted this job after a failure: it exports LOOM_RESTART,
/// the number of restarts so far (0 or unset on the first launch). fit then resumes from the
/// newest valid checkpoint of checkpoint_options::directory as if resume were set.
LOOM_DECL bool restarted_by_launcher();

/// Why a fit cannot resume exactly from a checkpoint's record (throws; returns when it can):
/// another seed, or a stop in the middle of an epoch with another batch, another training set
/// size or other data (`data`: data::identity_of the training set).
LOOM_DECL void check_resumable(const io::trainer_record& rec, const std::filesystem::path& path, std::uint64_t seed,
                               const fit_options& opts, std::size_t samples, const std::string& data);

/// What a checkpoint records and checks of a trainer, fixed for its lifetime.
struct checkpoint_facts {
  const io::network_description* network = nullptr;              ///< io::describe<Network>()
  const std::vector<io::tensor_description>* tensors = nullptr;  ///< its tensors
  std::size_t parameter_count = 0;
  const char* loss = "";
  const char* optimizer = "";
  std::string policy;
  std::uint64_t seed = 0;
  math_mode math = math_mode::fp32;
  float label_smoothing = 0.0f;  ///< trainer_options::label_smoothing
  std::string optimizer_options;  ///< every option, as text (detail::optimizer_options_text)
  std::vector<std::string> optimizer_buffers;  ///< the names of the optimizer buffers this rank keeps
};

/// The checkpoints of one trainer: its engine (erased), where its run is and its facts, and the
/// writer of its asynchronous checkpoints (kept by the trainer: it outlives a fit). A view made
/// where it is needed.
struct checkpoints {
  erased_engine& engine;
  run_state& run;
  const checkpoint_facts& facts;
  std::unique_ptr<io::checkpointer>& writer_slot;

  io::checkpointer& writer() const {
    if (!writer_slot) writer_slot = std::make_unique<io::checkpointer>();
    return *writer_slot;
  }
  /// The record of the current state (collective where the epoch's sums are summed over replicas).
  LOOM_DECL io::trainer_record record_now() const;
  /// This rank's parameters and optimizer buffers, copied to host memory (snapshot_staging).
  LOOM_DECL io::rank_snapshot snapshot() const;
  /// Starts writing a checkpoint of the current state in `directory` (collective; waits for the
  /// previous one first: it may be using the staging memory).
  LOOM_DECL void save(collectives& c, const std::filesystem::path& directory, bool async, std::size_t keep,
                      double commit_timeout_s) const;
  /// Reads a checkpoint (see trainer::load) and applies it; with fit's options, first checks that
  /// the run can continue from it exactly. `log` takes what it did, `warnings` each checkpoint
  /// refused (and then also the one it resumed from). Returns its path (empty when none_ok and
  /// none is there).
  LOOM_DECL std::filesystem::path load(collectives& c, const std::filesystem::path& where, bool none_ok, std::ostream* log,
                                       std::ostream* warnings, const fit_options* opts, std::size_t samples) const;
  /// The EMA of the weights from a checkpoint read (trainer_options::ema on): the one it holds,
  /// or, saved without one, its weights (said on `warnings`).
  LOOM_DECL void load_ema(const io::loaded_checkpoint& got, std::ostream* warnings) const;
  /// When no recovery is possible: a survivor holding a whole replica writes the state after
  /// the last step it finished as a checkpoint on its own (detail::emergency_checkpoint), so
  /// that plain mpirun loses no step. Never throws; says on stderr what it did.
  LOOM_DECL void emergency(const fit_options& opts) const noexcept;
};

/// SIGUSR1 and SIGTERM set fault_state.preemption_signal while this lives; the previous
/// handlers come back after.
class preemption_guard {
 public:
  LOOM_DECL explicit preemption_guard(bool on);
  preemption_guard(const preemption_guard&) = delete;
  preemption_guard& operator=(const preemption_guard&) = delete;
  LOOM_DECL ~preemption_guard();

 private:
  bool on_;
  struct sigaction old_usr1_ {}, old_term_ {};
};

/// The checkpoints of one fit, a step observer (see the file comment). Every rank must ask
/// alike (fit's options are checked).
class checkpoint_schedule final : public step_observer {
 public:
  /// Resumes from the newest valid checkpoint where opts asks for it (checkpoint_options::
  /// resume, or a restart by loomrun), before anything else of the fit is communicated; a
  /// replacement of a lost rank takes the survivors' state instead.
  LOOM_DECL static void resume_if_asked(checkpoints ck, collectives& world, const fit_options& opts, std::size_t samples,
                                        bool joining);

  /// `resumed`: this fit starts from a checkpoint loaded at the current step.
  LOOM_DECL checkpoint_schedule(checkpoints ck, collectives& world, failure_watch& watch, const fit_options& opts,
                                bool resumed);

  /// The step boundary: a checkpoint when due (every_steps, every_s, a signal), and a stop when
  /// a signal asked for one (false).
  LOOM_DECL bool after_step(const step_point& p) override;
  /// A checkpoint in flight was given up.
  void after_recovery() override { saved_step_ = none; }

  /// The fit's end: the checkpoint at the end (checkpoint_options::at_end) unless this step's
  /// is committed, then every write completed. Sets r.checkpoint (the last committed here),
  /// r.preempted and r.signal.
  LOOM_DECL void finish(fit_result& r);

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  bool on() const noexcept { return !opts_.checkpoint.directory.empty(); }
  /// Saves a checkpoint of now: first the previous (asynchronous) one completes, under the
  /// deadline checkpoint_begins set (its peers may wait for the slowest writer), and its time
  /// sets the deadline of this one's own collectives (failure_watch::checkpoint_measured).
  LOOM_DECL void save(bool async);

  checkpoints ck_;
  collectives& world_;
  failure_watch& watch_;
  const fit_options& opts_;
  preemption_guard signals_;
  bool agree_each_step_;  // the ranks agree on signals and time each step (one allreduce)
  monitor::clock::time_point last_checkpoint_time_;
  std::size_t saved_step_;
  int signal_ = 0;  // the signal that stopped the fit (0: none)
};

/// m's view of the buffers (running statistics) as a map of their own: its buffer_pieces as
/// pieces, for copy_to_whole and copy_from_whole.
inline shard_map buffer_map(const shard_map& m) {
  shard_map b = m;
  b.whole_count = m.whole_buffer_count;
  b.local_count = m.local_buffer_count;
  b.pieces = m.buffer_pieces;
  return b;
}

/// The whole network's buffers (m.whole_buffer_count values) on every rank, each value from the
/// rank that writes it (shard_map::writes: replica 0, slice 0) of `mine`, this rank's buffers as
/// m says. One allgather of every rank's values and the flags of those it writes. Collective.
LOOM_DECL std::vector<float> gather_whole_buffers(collectives& c, const shard_map& m, const std::vector<float>& mine);

}  // namespace loom::detail

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/train/impl/checkpointing.ipp"
#endif
