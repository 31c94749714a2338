// SPDX-License-Identifier: Apache-2.0
#pragma once
// The trainer's engine and data with their types erased, so that fit's loop, its checkpoints
// and its recoveries are written and compiled once for every trainer (train/impl/*.ipp, in
// loom::compiled under separate compilation): detail::erased_engine, everything that shared
// code asks of an engine — one interface, implemented once for every engine by
// detail::erased_engine_of<Engine> (loom/train/erased_engine_of.hpp) through the engine
// concepts (loom/parallel/engine.hpp) — and detail::erased_loader, this rank's share of each
// global batch from the data set's loader (data::loader_for_t<Dataset>). A virtual call per
// micro-step costs nothing against a step.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/fault.hpp"
#include "loom/monitor/fit_monitor.hpp"
#include "loom/nn/loss.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/parallel/shard_map.hpp"
#include "loom/train/fit_options.hpp"
#include "loom/train/run_state.hpp"

namespace loom::io {
class checkpointer;
}

namespace loom::detail {

/// What the shared code knows of an engine's capabilities in this run (engine_traits, and the
/// run-time half of recovering_engine: can_recover()).
struct engine_caps {
  /// recovering_engine: the engine's code can go on without lost ranks.
  bool recovering = false;
  /// It does in this run (can_recover(): not under ZeRO, more than one replica): failure
  /// detection on every collective, and the survivors' recovery.
  bool recovers = false;
  /// It also brings new processes in for the lost ranks (replacing_engine; fault_options::replace).
  bool replaces = false;
  /// detecting_engine without recovery in this run: deadlines, a roll call, the end of the job.
  bool detects = false;
  /// A failure without recovery ends with a roll call rather than an emergency checkpoint: no
  /// rank holds a whole replica (a detecting hybrid).
  bool ends_with_roll_call = false;
  /// A survivor holds a whole replica and may write an emergency checkpoint (recovering_engine
  /// with one rank per replica).
  bool keeps_whole_replica = false;
  /// engine_traits::every_rank_holds_loss.
  bool every_rank_holds_loss = true;
  /// engine_traits::replica_ranks: ranks that hold one model replica together.
  int replica_ranks = 1;
};

/// Any engine, as fit's loop, the checkpoints and the recoveries drive it (see the file
/// comment). The members are loom::engine's and its capabilities' (parallel/engine.hpp), plus
/// the state's moves through host memory and the recovery protocol over the engine's
/// communicator, whose type only the implementation knows.
class erased_engine : public monitor::rank_source {
 public:
  engine_caps caps;

  // loom::engine.
  virtual int replica() const = 0;
  virtual int replicas() const = 0;
  virtual std::size_t prepare_fit(std::size_t batch, std::size_t deterministic_chunk) = 0;
  virtual loss_value micro_step(const batch_view<float>& b, std::size_t m, std::size_t group, std::uint64_t seed,
                                std::uint64_t salt) = 0;
  virtual void sum(double* v, std::size_t n) = 0;
  /// Loss sums summed over the replicas (each counted once). Collective.
  void sum(loss_sums& s) {
    double v[] = {s.loss, s.correct, s.samples};
    sum(v, 3);
    s = {v[0], v[1], v[2]};
  }
  virtual void optimizer_step(float lr, double clip_grad_norm) = 0;
  virtual void reset_figures() = 0;
  virtual shard_map shard() const = 0;
  virtual std::size_t local_count() const = 0;
  /// The world's collectives for checkpoints and preemption (communicating_engine; alone: none).
  virtual std::unique_ptr<collectives> world_collectives() = 0;
  /// committing_engine: a hybrid that recovers commits each step over the world.
  virtual void set_step_commit(bool on) = 0;

  // The state through host memory (checkpoints, recovery); sharding_engine for the shard.
  /// What this rank holds of the optimizer state where that differs from shard() (ZeRO).
  virtual std::optional<shard_map> state_shard() const = 0;
  virtual bool shards_state() const = 0;
  /// Values per optimizer buffer here: local_count(), or the shard's.
  virtual std::size_t state_count() const = 0;
  virtual void parameters_to_host(float* dst) = 0;
  virtual void parameters_from_host(const float* src, std::size_t n) = 0;
  /// The model's buffers (running statistics) here: their count, and copies through host memory.
  virtual std::size_t buffer_values() const = 0;
  virtual void buffers_to_host(float* dst) = 0;
  virtual void buffers_from_host(const float* src, std::size_t n) = 0;
  virtual void buffer_to_host(std::size_t i, float* dst) = 0;
  virtual void buffer_from_host(std::size_t i, const float* src) = 0;
  virtual std::size_t optimizer_steps() = 0;
  virtual void set_optimizer_steps(std::size_t n) = 0;
  /// Host memory of n values for a snapshot, which the previous checkpoint has finished with:
  /// page-locked staging on a backend whose memory the host cannot read, null elsewhere (the
  /// snapshot then owns a new host vector).
  virtual float* snapshot_staging(std::size_t n) = 0;

  // Failures (detecting_engine, recovering_engine, replacing_engine).
  virtual void watch_for_failures(double deadline_s) = 0;
  virtual void set_deadline(double deadline_s) = 0;
  virtual std::string watch_job_id() = 0;
  virtual void after_recovery() = 0;
  /// The parameters and optimizer buffers of rank root to every rank (see recovering_engine).
  virtual void broadcast_state(int root) = 0;
  virtual bool finish_committed_step() = 0;
  /// The recovery protocol over the engine's communicator (train/recovery.hpp: detail::survive,
  /// end_after_failure, join_as_replacement), for this engine's communicator type.
  virtual fit_position survive(run_state& s, const rank_failure& f, const fit_options& opts, int number,
                               io::checkpointer* ckpt, std::string& report) = 0;
  [[noreturn]] virtual void end_after_failure(run_state& s, const rank_failure& f, const fit_options& opts) = 0;
  virtual fit_position join_as_replacement(run_state& s, const fit_options& opts) = 0;

  /// The memory loom::memory_plan says this rank needs at a full batch of `batch` (0: no plan).
  virtual std::size_t planned_bytes(std::size_t batch) const = 0;

 protected:
  ~erased_engine() = default;
};

/// Why a failure ends this job instead of a recovery (the roll call's report).
inline std::string why_no_recovery(const erased_engine& e) {
  if (e.shards_state())
    return "the optimizer state is sharded over the ranks (loom::shard_optimizer_state), and the lost ranks' "
           "slices are gone";
  if (e.replicas() > 1) {
    if (e.caps.recovering)
      return "recovery is off (the runtime ends the survivors under plain mpirun: run under loomrun or mpirun "
             "--enable-recovery), and no rank holds a whole model replica to write an emergency checkpoint";
    return "this communicator cannot rebuild itself over the survivors (the hybrids recover in place over "
           "loom::mpi_comm)";
  }
  return "the lost ranks held the only copy of their part of the model (a pipeline stage or a tensor slice)";
}

/// This rank's share of each global batch of a data set, in the engine's memory: the data
/// set's loader (data::loader_for_t<Dataset>) behind a small interface, filling the trainer's
/// batch buffers (detail::batch_buffers). fit's loop reads the data only through it.
class erased_loader {
 public:
  virtual void start_epoch(std::size_t epoch) = 0;
  /// Skips the next `batches` global batches of the epoch (a resumed run).
  virtual void skip(std::size_t batches) = 0;
  virtual std::size_t batches_per_epoch() const = 0;
  /// Deals each global batch in whole blocks of `block` samples (0: evenly; see
  /// data::distributed_loader::set_rank_block).
  virtual void set_rank_block(std::size_t block) = 0;
  /// This is the loader of replica `replica` of `replicas` from the next batch on (a recovery).
  virtual void reshard(int replica, int replicas) = 0;
  /// The next global batch's share of this rank: the samples and labels where the engine reads
  /// them. Its n may be 0 (a short last batch); global_n is 0 only past the epoch's end.
  virtual batch_view<float> next_batch() = 0;

 protected:
  ~erased_loader() = default;
};

}  // namespace loom::detail
