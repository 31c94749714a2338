// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::engine: what the one trainer (loom/train/trainer.hpp) asks of the engine of a policy,
// and the capabilities some engines add, each a concept by name (communicating_engine,
// detecting_engine, recovering_engine, replacing_engine, committing_engine, sharding_engine,
// staged_engine) with engine_traits<E> as their values. An engine owns this rank's model and
// optimizer state and runs everything between "here is this rank's share of a batch" and "the
// parameters have stepped": the passes, the loss, the communication of its policy, gradient
// clipping over the whole model and the optimizer step. The trainer owns the loop: epochs,
// batches, accumulation groups, progress, results.
//
// The engines: loom::replica_engine (single_process, data_parallel, tensor parallelism and its
// hybrid; loom/parallel/data/replica_engine.hpp) and loom::pipeline_engine (pipelines and their
// hybrid; loom/parallel/pipeline/engine.hpp).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/nn/loss.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom {

/// One micro-step's share of a batch for this rank, in the backend's memory.
template <class T>
struct batch_view {
  const T* x = nullptr;                  // (n, input): the samples; null where the engine reads none
  const std::int32_t* labels = nullptr;  // (n): the labels; null where the engine reads none
  std::size_t n = 0;                     // samples of this replica (this rank's share)
  std::size_t global_n = 0;              // samples of the whole batch (all replicas)
  std::size_t offset = 0;                // the first of this replica's samples within the global batch
};

/// How data parallelism sends the gradients: as they are (float), or rounded to 16 bits
/// (loom::compress<bf16>, loom::compress<fp16>).
enum class gradient_wire { native, bf16, fp16 };
/// "native", "bf16", "fp16" ("?" for a value that is none of them).
constexpr const char* to_string(gradient_wire w) noexcept {
  switch (w) {
    case gradient_wire::native: return "native";
    case gradient_wire::bf16: return "bf16";
    case gradient_wire::fp16: return "fp16";
  }
  return "?";
}

/// The options of a data_parallel policy that can also be taken at run time: the wire format
/// (gradient_wire::bf16 and fp16 as loom::compress<bf16> and compress<fp16>) and ZeRO stage 1
/// (shard_state as loom::shard_optimizer_state), and synchronized batch norm
/// (loom::sync_batch_norm). A program that reads them from a flag names
/// loom::data_parallel<Comm, loom::choose_at_run_time> and hands loom::trainer one of these.
/// Inside loom, the trainers of one network, optimizer and communicator share one compiled
/// body whatever these are (detail::code_policy, loom/train/trainer.hpp): a policy that names
/// them still fixes them at compile time, and they reach that body as these values.
struct data_parallel_choice {
  gradient_wire wire = gradient_wire::native;
  bool shard_state = false;
  /// Synchronized batch norm (loom::sync_batch_norm).
  bool sync_batch_norm = false;
};

/// What an engine is built from: the trainer's seed and math mode, the optimizer's options,
/// the job every rank must share (key=value fields, compared across ranks before anything
/// else is communicated), and for data parallelism the options it takes at run time.
template <class OptimizerOptions>
struct engine_setup {
  std::uint64_t seed = 1;
  math_mode math = math_mode::fp32;
  OptimizerOptions optimizer{};
  std::string job;
  data_parallel_choice data_parallel{};
  /// The loss's label smoothing (trainer_options::label_smoothing; loss_workspace carries it).
  float label_smoothing = 0.0f;
};

namespace detail {
/// Whether Comm can move the memory Backend computes in: any communicator (or none, void)
/// moves host memory; GPU memory needs one that says so (nccl_comm::moves_device_memory).
template <class Comm, class Backend>
constexpr bool comm_reaches_memory_of() {
  if constexpr (std::is_void_v<Comm> || Backend::memory_space::host_accessible) return true;
  else return requires { requires Comm::moves_device_memory; };
}

/// math, when Backend can run it; otherwise throws loom::invalid_argument saying what to use.
/// Every engine checks it after the job check, so ranks that disagree hear of that first.
template <class Backend>
math_mode checked_math(math_mode math) {
  if (!Backend::supports(math))
    throw invalid_argument(std::string("loom::trainer: trainer_options::math = loom::math_mode::") + to_string(math) +
                           " is not available on loom::" + Backend::name + " here (see loom::" + Backend::name +
                           "::supports): use math_mode::fp32");
  return math;
}
}  // namespace detail

/// The engine of a policy, as the trainer drives it. E::value_type is the parameters' type,
/// E::backend_type the backend they live on.
///
/// - rank(), world(): this process in the whole world; replica(), replicas(): the data split
///   (which share of every batch this rank's replica reads: the loader's rank and ranks).
/// - reads_samples(), reads_labels(): whether this rank needs the batch's samples and labels
///   (a pipeline's first and last stages); the trainer fills only those.
/// - check_same_job(d): every rank describes the same d, or every rank throws the same
///   loom::communication_error naming the ranks and the fields that differ. Collective.
/// - prepare_fit(batch, deterministic_chunk): readies a fit of this global batch; returns the
///   block of samples the loader must keep whole per rank (0: none), throws
///   loom::invalid_argument when the engine cannot run the mode.
/// - micro_step(b, m, group, seed, step): micro-step m of an accumulation group of `group`:
///   forward, loss (gradient scaled by 1 / (b.global_n * group)), backward, and on the last one
///   the gradient communication. Returns this rank's loss sums (zero where it holds no loss).
/// - optimizer_step(lr, clip): clips the whole model's gradient norm to clip (0: none) and
///   steps the optimizer at learning rate lr.
/// - evaluate_batch(b, seed, step) and end_evaluation(): forward only; loss sums as above.
/// - sum(v, n): v[0, n) summed over the replicas, each replica counted once, on every rank
///   (ranks holding no loss contribute nothing). Collective.
/// - figures(), reset_figures(), gather_figures(): this rank's figures, and every rank's on
///   every rank (collective); gather_timelines(t, dropped): every rank's spans on world rank 0
///   (collective); flops_per_sample(): forward FLOPs of what this rank runs.
/// - shard(): what this rank holds (loom::shard_map); local_parameters(), local_count(): its
///   flat parameters in the backend's memory, and their count.
/// - parameters_l2(), gather_parameters(): the whole model's norm and flat parameters on every
///   rank (collective over the model-parallel group).
/// - model(), optimizer(): this rank's model and optimizer state; settle(): completes whatever
///   the last step left in flight on the parameters (ZeRO's gathers; a no-op elsewhere).
/// - E::every_rank_holds_loss: false where some ranks holding samples hold no loss (a
///   pipeline's first stages); E::replica_ranks: the ranks that hold one model replica together
///   (a hybrid's go on or leave whole).
template <class E>
concept engine = requires(E& e, const E& ce, const batch_view<typename E::value_type>& b, std::size_t n, std::uint64_t u,
                          double* v, const std::string& s, float lr, double clip, const monitor::timeline& t,
                          std::vector<std::size_t>& d) {
  typename E::value_type;
  typename E::backend_type;
  { ce.rank() } -> std::same_as<int>;
  { ce.world() } -> std::same_as<int>;
  { ce.replica() } -> std::same_as<int>;
  { ce.replicas() } -> std::same_as<int>;
  { ce.reads_samples() } -> std::same_as<bool>;
  { ce.reads_labels() } -> std::same_as<bool>;
  e.check_same_job(s);
  { e.prepare_fit(n, n) } -> std::same_as<std::size_t>;
  { e.micro_step(b, n, n, u, u) } -> std::same_as<loss_value>;
  e.optimizer_step(lr, clip);
  { e.evaluate_batch(b, u, u) } -> std::same_as<loss_value>;
  e.end_evaluation();
  e.sum(v, n);
  { e.figures() } -> std::same_as<rank_figures&>;
  e.reset_figures();
  { e.gather_figures() } -> std::same_as<std::vector<rank_figures>>;
  { e.gather_timelines(t, d) } -> std::same_as<std::vector<std::vector<monitor::span_event>>>;
  { ce.flops_per_sample() } -> std::convertible_to<double>;
  { ce.shard() } -> std::same_as<shard_map>;
  { e.local_parameters() } -> std::same_as<typename E::value_type*>;
  { ce.local_count() } -> std::same_as<std::size_t>;
  { e.local_buffers() } -> std::same_as<typename E::value_type*>;
  { ce.local_buffer_count() } -> std::same_as<std::size_t>;
  { e.parameters_l2() } -> std::same_as<double>;
  { e.gather_parameters() } -> std::same_as<std::vector<typename E::value_type>>;
  e.model();
  e.optimizer();
  e.settle();
  { E::every_rank_holds_loss } -> std::convertible_to<bool>;
  { E::replica_ranks } -> std::convertible_to<int>;
};

/// An engine whose ranks share a communicator (every policy but single_process): world_comm(),
/// over which the trainer's checkpoints agree (loom::comm_collectives).
template <class E>
concept communicating_engine = engine<E> && requires(E& e) {
  e.world_comm();
  requires communicator<std::remove_cvref_t<decltype(e.world_comm())>>;
};

/// An engine that detects a dead or hung rank (over loom::mpi_comm): watch_for_failures(d) puts
/// a deadline on every communicator it uses, set_deadline(d) changes it, and the roll call of
/// loom::recover_world (and its fencing) runs over its world — a roll call that names the lost
/// ranks before the job ends, where the engine cannot go on without them.
template <class E>
concept detecting_engine = communicating_engine<E> &&
    requires(E& e, double d, const recovery_request& q, const recovery_result& r) {
      e.watch_for_failures(d);
      e.set_deadline(d);
      recover_world(e.world_comm(), q);
      fence_left_out(e.world_comm(), r);
    };

/// An engine that goes on without the lost ranks (data parallelism, the hybrids' whole
/// replicas: E::recoverable): can_recover() (this run can: not under ZeRO, more than one
/// replica), after_recovery() once recover_world rebuilt its world, broadcast_state(root): the
/// parameters and optimizer buffers of the survivor `root` to every rank.
template <class E>
concept recovering_engine = detecting_engine<E> && E::recoverable && requires(E& e, const E& ce, int root) {
  { ce.can_recover() } -> std::convertible_to<bool>;
  e.after_recovery();
  e.broadcast_state(root);
};

/// A recovering engine that can also bring new processes in for the lost ranks
/// (fault_options::replace): one rank per replica, over a communicator that spawns and merges
/// them (loom::spawn_replacements, loom::mpi_comm).
template <class E>
concept replacing_engine = recovering_engine<E> && E::replica_ranks == 1 &&
    requires(E& e, const std::vector<std::string>& hosts, double d) {
      spawn_replacements(e.world_comm(), hosts, d);
      e.world_comm().watch_deadlines_only(d);
    };

/// An engine whose optimizer steps may be committed over the world first (a hybrid that
/// recovers: detail::step_commit): set_step_commit(on), and finish_committed_step() — the step
/// a failure interrupted after its commit completed elsewhere, taken from this rank's reduced
/// gradients (false: none pending).
template <class E>
concept committing_engine = engine<E> && requires(E& e, bool on) {
  e.set_step_commit(on);
  { e.finish_committed_step() } -> std::same_as<bool>;
};

/// An engine that may shard its optimizer state (ZeRO stage 1): shards_state() (whether this
/// run does), state_shard() (what this rank holds of the state), state_count() (values per
/// optimizer buffer here).
template <class E>
concept sharding_engine = engine<E> && requires(const E& ce) {
  { ce.shards_state() } -> std::convertible_to<bool>;
  { ce.state_shard() } -> std::same_as<shard_map>;
  { ce.state_count() } -> std::same_as<std::size_t>;
};

/// An engine that runs one pipeline stage: stage(), models() (a std::variant over the stages'
/// models holding this rank's), E::stages and E::stage_model_type<S>.
template <class E>
concept staged_engine = engine<E> && requires(E& e, const E& ce) {
  { ce.stage() } -> std::same_as<int>;
  e.models();
  { E::stages } -> std::convertible_to<std::size_t>;
  typename E::template stage_model_type<0>;
};

/// What the trainer's shared code knows of an engine type: its capabilities, as values.
template <engine E>
struct engine_traits {
  static constexpr bool communicates = communicating_engine<E>;
  static constexpr bool detects = detecting_engine<E>;
  static constexpr bool recovers = recovering_engine<E>;
  static constexpr bool replaces = replacing_engine<E>;
  static constexpr bool commits = committing_engine<E>;
  static constexpr bool shards = sharding_engine<E>;
  static constexpr bool staged = staged_engine<E>;
  static constexpr bool every_rank_holds_loss = E::every_rank_holds_loss;
  static constexpr int replica_ranks = E::replica_ranks;
};

namespace detail {
/// Whether X (a gradient_allreduce, or a sync holding one) sends its gradients compressed
/// (loom::compress<>, parallel/data/data_parallel.hpp).
template <class X>
inline constexpr bool compresses_v = [] {
  if constexpr (requires { X::compressed; }) return X::compressed;
  else return false;
}();
/// Whether X (a gradient_allreduce) shards the optimizer state (loom::shard_optimizer_state).
template <class X>
inline constexpr bool shards_state_v = [] {
  if constexpr (requires { X::sharded; }) return X::sharded;
  else return false;
}();
/// Whether X (a gradient_allreduce) may shard the optimizer state: it does (shards_state_v), or
/// it takes that choice at run time (data_parallel_choice).
template <class X>
inline constexpr bool may_shard_state_v = [] {
  if constexpr (requires { X::may_shard; }) return X::may_shard;
  else return false;
}();

}  // namespace detail

}  // namespace loom
