// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::trainer<Network, Loss, Optimizer, Policy, Backend>: the one trainer of every policy. It
// runs fit (epochs of seeded, shuffled batches, accumulation groups, progress, results) and
// evaluate (loss and accuracy) over the policy's engine (loom/parallel/engine.hpp), which owns
// the model and optimizer state and does everything within a step: loom::replica_engine for
// single_process, data_parallel, tensor parallelism and its hybrid; loom::pipeline_engine for
// pipelines and their hybrid. On a backend whose memory the host cannot reach (loom::cuda),
// batches are filled on the host in the backend's staging memory (pinned) and copied over
// asynchronously.

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <array>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/default_backend.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/type_name.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/loader.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/live.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/monitor/metrics.hpp"
#include "loom/monitor/progress.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/adam.hpp"
#include "loom/optim/any.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/core/fault.hpp"
#include "loom/parallel/hybrid.hpp"
#include "loom/parallel/memory_plan.hpp"
#include "loom/parallel/pipeline_engine.hpp"
#include "loom/parallel/replica_engine.hpp"
#include "loom/parallel/single_process.hpp"
#include "loom/parallel/tensor_parallel_sync.hpp"
#include "loom/train/recovery.hpp"

namespace loom {

namespace detail {
/// Where the host fills batches for Backend: its staging_space when it has one (page-locked
/// memory for loom::cuda), host memory otherwise.
template <class Backend>
struct staging_space_of {
  using type = host_space;
};
template <class Backend>
  requires requires { typename Backend::staging_space; }
struct staging_space_of<Backend> {
  using type = typename Backend::staging_space;
};

/// The engine the trainer drives for Policy (void: a policy the trainer does not take), and
/// its communicator (void when training alone). One specialisation per policy; the engines
/// satisfy loom::engine.
/// Stands for the engine of a policy the trainer does not take, so that the trainer's
/// static_assert is the one error the compiler prints.
struct no_engine_for_policy {};
template <class Network, class Loss, class Optimizer, class Policy, class Backend>
struct engine_for {
  using type = no_engine_for_policy;
  using comm = void;
  template <class... Args>
  static type make(Args&&...) {
    return {};
  }
};
template <class Network, class Loss, class Optimizer, class Backend>
struct engine_for<Network, Loss, Optimizer, single_process, Backend> {
  using type = replica_engine<Network, Loss, Optimizer, Backend, single_process_sync<Network, float>>;
  using comm = void;
  static type make(const engine_setup<typename Optimizer::options>& s) { return type(single_process_sync<Network, float>(), s); }
};
template <class Network, class Loss, class Optimizer, class Comm, class... Options, class Backend>
struct engine_for<Network, Loss, Optimizer, data_parallel<Comm, Options...>, Backend> {
  using sync = gradient_allreduce<Network, float, data_parallel<Comm, Options...>>;
  using type = replica_engine<Network, Loss, Optimizer, Backend, sync>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s) {
    return type(sync(std::move(c), s.data_parallel), s);
  }
};
template <class Network, class Loss, class Optimizer, std::size_t Width, class Comm, class Backend>
struct engine_for<Network, Loss, Optimizer, model_parallel<tensor_parallel<Width>, Comm>, Backend> {
  using sync = tensor_parallel_sync<Network, float, Comm, Width>;
  using type = replica_engine<Network, Loss, Optimizer, Backend, sync>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s) { return type(sync(std::move(c)), s); }
};
template <class Network, class Loss, class Optimizer, class Comm, class... DO, std::size_t Width, class Backend>
struct engine_for<Network, Loss, Optimizer, hybrid<data_parallel<Comm, DO...>, tensor_parallel<Width>>, Backend> {
  using sync = tensor_parallel_sync<Network, float, Comm, Width, data_parallel<Comm, DO...>>;
  using type = replica_engine<Network, Loss, Optimizer, Backend, sync>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s) { return type(sync(std::move(c)), s); }
};
template <class Network, class Loss, class Optimizer, std::size_t S, class... O, class Comm, class Backend>
struct engine_for<Network, Loss, Optimizer, model_parallel<pipeline<S, O...>, Comm>, Backend> {
  using type = pipeline_engine<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s, const pipeline_run_table& table) {
    return type(std::move(c), s, table);
  }
};
template <class Network, class Loss, class Optimizer, class Comm, class... DO, std::size_t S, class... O, class Backend>
struct engine_for<Network, Loss, Optimizer, hybrid<data_parallel<Comm, DO...>, pipeline<S, O...>>, Backend> {
  using type = pipeline_engine<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm, data_parallel<Comm, DO...>>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s, const pipeline_run_table& table) {
    return type(std::move(c), s, table);
  }
};

/// The policy whose code a trainer of Policy runs: Policy itself, except that a pipeline's
/// micro-batch count and schedule are left out (its stage count and cut points stay), so that
/// every micro-batch count and schedule of one cut shares one compiled trainer; and that
/// data_parallel's wire format (compress<>) and ZeRO (shard_optimizer_state) are left to run
/// time (detail::choice_at_run_time), so that plain, compressed and sharded data parallelism
/// over one communicator share one too. The schedule is still verified at compile time
/// (loom::trainer builds its tables from Policy), and both reach the shared code as data
/// (trainer_facts).
template <class Policy>
struct code_policy {
  using type = Policy;
};
template <class Comm, class... O>
  requires sharding_communicator<Comm>
struct code_policy<data_parallel<Comm, O...>> {
  using type = data_parallel<Comm, bucket_bytes<data_parallel<Comm, O...>::bucket_cap_bytes>, choice_at_run_time>;
};
template <std::size_t S, class... O, class Comm>
struct code_policy<model_parallel<pipeline<S, O...>, Comm>> {
  using type = model_parallel<typename stage_cut_of<pipeline<S, O...>>::type, Comm>;
};
template <class Comm, class... DO, std::size_t S, class... O>
struct code_policy<hybrid<data_parallel<Comm, DO...>, pipeline<S, O...>>> {
  using type = hybrid<data_parallel<Comm, DO...>, typename stage_cut_of<pipeline<S, O...>>::type>;
};
template <class Policy>
using code_policy_t = typename code_policy<Policy>::type;

/// What the trainer's shared code (trainer_body, keyed by code_policy_t<Policy>) needs to know
/// of the policy a user named, as values: its name (job descriptions, checkpoint records,
/// messages), a pipeline's schedule tables, and loom::memory_plan's bytes for a rank.
template <class OptimizerOptions>
struct trainer_facts {
  std::string name;
  std::optional<pipeline_run_table> table;  // pipelines: the schedule the user named
  data_parallel_choice data_parallel;       // data_parallel: its wire format and ZeRO
  /// memory_plan's bytes of rank `rank` at `share` samples of a global `batch` over `replicas`
  /// replicas; null where the plan does not apply (a backend other than loom::cpu).
  std::size_t (*planned)(const OptimizerOptions& opt, std::size_t rank, std::size_t share, std::size_t batch,
                         std::size_t replicas) = nullptr;
};
template <class Network, class Optimizer, class Policy, class Backend>
trainer_facts<typename Optimizer::options> trainer_facts_of() {
  trainer_facts<typename Optimizer::options> f;
  f.name = type_name<Policy>();
  f.data_parallel = data_parallel_choice_of<Policy>();
  if constexpr (requires { typename Policy::parallelism; }) {
    if constexpr (is_pipeline_v<typename Policy::parallelism>)
      f.table = pipeline_run_table::of<typename Policy::parallelism>();
  }
  if constexpr (std::is_same_v<Backend, cpu>)
    f.planned = [](const typename Optimizer::options& opt, std::size_t rank, std::size_t share, std::size_t batch,
                   std::size_t replicas) -> std::size_t {
      return rank_memory_for<Network, Optimizer, Policy>(opt, rank).bytes_at(share, batch, replicas);
    };
  return f;
}

/// The data_parallel policy that names what a run-time choice chose: Policy
/// (data_parallel<Comm, ..., choose_at_run_time>) with Chosen (compress<H>,
/// shard_optimizer_state) in place of choose_at_run_time, its bucket size kept.
template <class Policy, class... Chosen>
using chosen_data_parallel =
    std::conditional_t<Policy::bucket_cap_bytes == data_parallel<typename Policy::comm_type>::bucket_cap_bytes,
                       data_parallel<typename Policy::comm_type, Chosen...>,
                       data_parallel<typename Policy::comm_type, bucket_bytes<Policy::bucket_cap_bytes>, Chosen...>>;

/// The facts of a trainer of Policy (data_parallel<Comm, ..., choose_at_run_time>) built with
/// `choice`: those of the policy that names the same options (chosen_data_parallel), so that
/// the run describes itself as that policy's would (job checks, checkpoint records, the memory
/// plan). Throws loom::invalid_argument for a choice the communicator or the backend cannot run.
template <class Network, class Optimizer, class Policy, class Backend>
trainer_facts<typename Optimizer::options> trainer_facts_of_choice(const data_parallel_choice& choice) {
  using comm = typename Policy::comm_type;
  auto with = [&]<class... Chosen>() { return trainer_facts_of<Network, Optimizer, chosen_data_parallel<Policy, Chosen...>, Backend>(); };
  if (choice.wire != gradient_wire::native && choice.wire != gradient_wire::bf16 && choice.wire != gradient_wire::fp16)
    throw invalid_argument("loom::trainer: data_parallel_choice::wire is not one of loom::gradient_wire's values (found " +
                           std::to_string(static_cast<int>(choice.wire)) + ")");
  if (choice.wire != gradient_wire::native && !Backend::memory_space::host_accessible)
    throw invalid_argument(std::string("loom::trainer: data_parallel_choice::wire = gradient_wire::") +
                           to_string(choice.wire) +
                           " (loom::compress<>): compressed gradients are converted in host memory; this backend's "
                           "gradients are not (loom::" + Backend::name + "): choose gradient_wire::native");
  if (choice.shard_state) {
    if constexpr (sharding_communicator<comm>) {
      if (choice.wire == gradient_wire::bf16) return with.template operator()<compress<bf16>, shard_optimizer_state>();
      if (choice.wire == gradient_wire::fp16) return with.template operator()<compress<fp16>, shard_optimizer_state>();
      return with.template operator()<shard_optimizer_state>();
    } else {
      throw invalid_argument("loom::trainer: data_parallel_choice::shard_state (ZeRO): this communicator has no "
                             "ireduce_scatter_v / iallgather_v (blocks of different sizes); use loom::mpi_comm, "
                             "loom::nccl_comm or loom::local_comm");
    }
  }
  if (choice.wire == gradient_wire::bf16) return with.template operator()<compress<bf16>>();
  if (choice.wire == gradient_wire::fp16) return with.template operator()<compress<fp16>>();
  return with.template operator()<>();
}

extern "C" inline void loom_preemption_handler(int sig) { preemption_signal = sig; }

/// SIGUSR1 and SIGTERM set preemption_signal while this lives; the previous handlers come back
/// after.
class preemption_guard {
 public:
  explicit preemption_guard(bool on) : on_(on) {
    preemption_signal = 0;
    if (!on_) return;
    struct sigaction sa {};
    sa.sa_handler = loom_preemption_handler;
    sa.sa_flags = SA_RESTART;  // system calls the signal lands in (the writer thread's, MPI's) resume
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGUSR1, &sa, &old_usr1_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  preemption_guard(const preemption_guard&) = delete;
  preemption_guard& operator=(const preemption_guard&) = delete;
  ~preemption_guard() {
    if (!on_) return;
    ::sigaction(SIGUSR1, &old_usr1_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  bool on_;
  struct sigaction old_usr1_ {}, old_term_ {};
};

/// Whether loomrun (bin/loomrun) restarted this job after a failure: it exports LOOM_RESTART,
/// the number of restarts so far (0 or unset on the first launch). fit then resumes from the
/// newest valid checkpoint of checkpoint_options::directory as if resume were set.
LOOM_DECL bool restarted_by_launcher();

template <class Engine>
inline constexpr bool is_pipeline_engine_v = false;
template <class N, class L, class O, class B, class P, class C, class D>
inline constexpr bool is_pipeline_engine_v<pipeline_engine<N, L, O, B, P, C, D>> = true;

/// Whether an engine's rank holds the loss wherever it holds samples (every rank but a
/// pipeline's non-last stages).
template <class Engine>
constexpr bool every_rank_holds_loss() {
  if constexpr (requires { Engine::every_rank_holds_loss; }) return Engine::every_rank_holds_loss;
  else return true;
}

/// The compile-time checks of a data set against a network (every trainer runs them): the
/// samples have the network's input size and the labels as many classes as its output.
template <class Network, class Dataset>
constexpr void check_dataset_for() {
  using sample = typename Dataset::sample_shape;
  constexpr std::size_t out_width = Network::output_shape::size;
  static_assert(!Network::chain::ok || sample::size == Network::input_shape::size,
                "loom::trainer: the data set's samples do not have the network's input size (the network input "
                "shape and the sample shape are in the loom::diagnostic:: name the compiler prints)");
  if constexpr (Network::chain::ok && sample::size != Network::input_shape::size)
    detail::fail_with<diagnostic::network_input_does_not_match_samples<typename Network::input_shape, sample>>();
  static_assert(!Network::chain::ok || out_width == Dataset::classes,
                "loom::trainer: the loss's width (the network's output size) does not match the number of classes "
                "of the data set's labels: end the network with loom::linear<Classes> (both numbers are in the "
                "loom::diagnostic:: name the compiler prints)");
  if constexpr (Network::chain::ok && out_width != Dataset::classes)
    detail::fail_with<diagnostic::loss_width_does_not_match_classes<typename Network::output_shape, Dataset::classes>>();
}

}  // namespace detail

/// Options of the trainer itself (not of the optimizer).
struct trainer_options {
  /// Seed of parameter initialisation, shuffling and dropout.
  std::uint64_t seed = 1;
  /// Threads of the one compute pool; 0 = cores available / ranks on this host.
  int threads = 0;
  /// Precision of matrix products and convolutions: fp32, or bf16 (mixed precision: bf16
  /// operands, float accumulation; parameters, gradients and optimizer state stay float).
  /// The trainer's constructor throws loom::invalid_argument when the backend cannot run it
  /// (Backend::supports(math) is false).
  math_mode math = math_mode::fp32;
};

/// Options of one fit() call.
struct fit_options {
  std::size_t epochs = 1;
  /// Samples per step.
  std::size_t batch = 64;
  /// Stop after this many optimizer steps in all (0: no limit).
  std::size_t max_steps = 0;
  /// Gradient accumulation: each optimizer step sums the gradients of this many consecutive
  /// batches (micro-steps), as one step on a batch this many times larger. Under
  /// data_parallel, gradients are communicated only on the last micro-step.
  std::size_t accumulation = 1;
  /// Learning rate at step s from the optimizer's base rate (constant_lr, step_lr,
  /// cosine_warmup, or any float(std::size_t step, float base_lr) callable).
  lr_schedule schedule{};
  /// Clip the global gradient norm to this value before each step (0: no clipping).
  double clip_grad_norm = 0;
  /// Split-invariant (deterministic) mode, 0 = off: cut every global batch into chunks of this
  /// many consecutive samples, run each chunk's forward and backward on its own, and add the
  /// chunk gradients in one fixed binary tree over the chunk index, across ranks by send/recv
  /// instead of an allreduce — so the parameters after any number of steps are bitwise the same
  /// on 1, 2, 3, ... ranks (at the same threads per rank), and a run resumed on another number
  /// of ranks ends as the one that never stopped. Any number of ranks, as long as a full batch
  /// has at least one chunk per rank; rank r takes a contiguous range of whole chunks
  /// (loom::chunk_plan). Gradients are exchanged after every micro-step of an accumulation
  /// group. Costs smaller gemms and an exchange without overlap (docs/data-parallel.md).
  /// single_process and data_parallel only.
  std::size_t deterministic_chunk = 0;
  /// Where progress goes (null: nowhere) and how.
  std::ostream* progress = &std::cerr;
  /// Where warnings go, apart from progress so that silencing progress never silences them: a
  /// checkpoint refused on resume (and the older one taken instead). Null: nowhere. (A lost rank
  /// and its recovery, a preemption's checkpoint and skipped samples are reported on stderr by
  /// the ranks themselves.)
  std::ostream* warnings = &std::cerr;
  progress_mode progress_style = progress_mode::automatic;
  /// Each rank's live metrics files (Prometheus textfile, JSON lines, TensorBoard events) and how often they are
  /// rewritten (loom/monitor/metrics.hpp); none by default.
  metrics_options metrics{};
  /// Seconds between refreshes of the live view on rank 0's progress stream (0: none;
  /// loom/monitor/live.hpp): a row per rank (past 16, min / median / max), the straggler when
  /// there is one. The ranks exchange their figures at step counts derived from rank 0's step
  /// time, about this often. Every rank must ask alike (checked).
  double live_every_s = 0;
  /// A Chrome trace JSON timeline of this fit (empty: none; loom/monitor/timeline.hpp): rank 0
  /// writes this file with every rank as a process, clocks aligned on the collective that
  /// starts fit; under several ranks each rank also writes its own, `.rank<r>` before the
  /// extension. Opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Every rank must ask
  /// alike (checked).
  std::string trace;
  /// Seconds between samples of the machine (memory, CPU, network, the GPU through NVML;
  /// loom/monitor/sampler.hpp), which the metrics files carry and the timeline shows as
  /// counters. A sample costs a few microseconds.
  double sample_every_s = 1.0;
  /// Checkpoints: where, how often, how many kept, resuming, preemption by signal
  /// (loom/io/checkpoint.hpp, docs/checkpoints.md); none by default. Every rank must ask alike
  /// (checked).
  checkpoint_options checkpoint{};
  /// Failure detection and recovery from a dead or hung rank (data_parallel over
  /// loom::mpi_comm; docs/fault-tolerance.md). Every rank must ask alike (checked).
  fault_options fault{};
};

/// What fit() measured.
struct fit_result {
  std::size_t epochs = 0;
  /// Optimizer steps this fit took.
  std::size_t steps = 0;
  /// Samples of the epochs this fit ran, over all replicas — a resumed epoch's samples before
  /// the checkpoint included (what train_loss and train_accuracy average over).
  std::size_t samples = 0;
  /// Samples this fit trained on itself, over all replicas (after a resume, only those after
  /// the checkpoint): what samples_per_s() divides.
  std::size_t trained_samples = 0;
  /// Mean loss and accuracy over the samples of the last epoch run.
  double train_loss = 0;
  double train_accuracy = 0;
  /// Wall time spent in training steps (data preparation included, evaluation excluded).
  double seconds = 0;
  /// The training rate of this fit: trained_samples / seconds.
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(trained_samples) / seconds : 0; }
  /// Processes that trained together, and each one's figures (rank order; one entry when
  /// training alone).
  int ranks = 1;
  std::vector<rank_figures> figures;
  /// The optimizer step this fit started from (non-zero when it resumed from a checkpoint).
  std::size_t resumed_from_step = 0;
  /// fit stopped early because of SIGUSR1 or SIGTERM (checkpoint_options::on_signal), after
  /// committing a checkpoint: `checkpoint` says where; resuming from it continues exactly.
  bool preempted = false;
  int signal = 0;
  /// The last checkpoint this fit committed (empty: none).
  std::string checkpoint;
  /// Recoveries from a failed or hung rank during this fit (each reported on stderr); `ranks`
  /// is the world after them.
  int recoveries = 0;
};

/// What evaluate() measured.
struct eval_result {
  std::size_t samples = 0;
  double loss = 0;
  double accuracy = 0;
};


namespace detail {

/// The checks of fit's options, on every rank alike before anything is communicated.
LOOM_DECL void check_fit_options(const fit_options& opts, std::size_t samples);
LOOM_DECL void checkpoint_hooks_for_tests(int rank);

/// fault_options::replace where the policy cannot have it: `watch` (the policy recovers on
/// fewer ranks) and `replace` (it can also merge new processes in) say what it has.
LOOM_DECL void check_replace(const fault_options& fo, bool watch, bool replace, const std::string& policy);

/// A fit's options as the ranks compare them (and a replacement with the survivors').
LOOM_DECL std::string describe_fit(const fit_options& opts, std::size_t samples);

/// Rank 0's warning when fault_options::replace is on but no recovery runs in this fit.
LOOM_DECL void warn_replace_without_recovery(const fault_options& fo, bool watching);

/// The job every rank must share (the trainer's part; the engine adds its policy's own fields).
LOOM_DECL std::string describe_job(const std::string& network, std::size_t parameters, const char* loss, const char* optimizer,
                                   std::uint64_t seed, math_mode math, const std::string& policy);

/// Why a fit cannot resume exactly from a checkpoint's record (empty: it can): another seed,
/// or a stop in the middle of an epoch with another batch, another training set size or other
/// data (`data`: data::identity_of the training set).
LOOM_DECL void check_resumable(const io::trainer_record& rec, const std::filesystem::path& path, std::uint64_t seed,
                               const fit_options& opts, std::size_t samples, const std::string& data);

}  // namespace detail

namespace detail {

/// What fit's loop (trainer_core::run_fit) needs from the typed trainer: its engine, its data
/// set's loader and its model's state. One small adapter per trainer type and data set
/// (trainer::fit_part) implements it; the loop itself is compiled once for every trainer.
class fit_host {
 public:
  /// What the policy offers, as compile-time facts of the trainer: failure detection and
  /// recovery (can_watch), replacement of lost ranks (can_replace), failure detection where no
  /// recovery is possible — pipelines, tensor parallelism, the hybrids, sharded optimizer state
  /// (can_detect: deadlines on every communicator, then a roll call, and the job ends) — the
  /// loss on every rank holding samples (per_epoch_sums).
  bool can_watch = false, can_replace = false, can_detect = false, per_epoch_sums = true;
  /// Whether a failure the run does not recover from ends with a roll call (end_after_failure)
  /// rather than an emergency checkpoint: a hybrid, none of whose ranks holds a whole replica.
  bool ends_without_recovery = false;

  // The engine (loom::engine).
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int replica() const = 0;
  virtual int replicas() const = 0;
  virtual std::size_t prepare_fit(std::size_t batch, std::size_t deterministic_chunk) = 0;
  virtual void reset_figures() = 0;
  virtual rank_figures& figures() = 0;
  virtual std::vector<rank_figures> gather_figures() = 0;
  virtual double flops_per_sample() const = 0;
  virtual loss_value micro_step(const batch_view<float>& b, std::size_t m, std::size_t group, std::uint64_t seed,
                                std::uint64_t salt) = 0;
  virtual void sum(double* v, std::size_t n) = 0;
  virtual void optimizer_step(float lr, double clip_grad_norm) = 0;
  /// Whether the engine commits each step over the world (a hybrid that recovers in the
  /// process: detail::step_commit); a no-op for the others.
  virtual void set_step_commit(bool on) = 0;
  // The failure detector of the engine's communicators (can_watch or can_detect).
  virtual void watch_for_failures(double deadline_s) = 0;
  virtual void set_deadline(double deadline_s) = 0;
  virtual std::string watch_job_id() = 0;
  // The data set's loader (data::distributed_loader), this rank's share of each batch.
  virtual void open_loader(std::size_t batch) = 0;
  virtual void set_rank_block(std::size_t block) = 0;
  virtual void reshard(int replica, int replicas) = 0;
  virtual void start_epoch(std::size_t epoch) = 0;
  virtual void skip(std::size_t batches) = 0;
  virtual std::size_t batches_per_epoch() const = 0;
  virtual void reserve(std::size_t batch) = 0;
  virtual batch_view<float> next_batch() = 0;
  // The trainer.
  virtual std::unique_ptr<collectives> make_collectives() = 0;
  virtual void load_checkpoint(collectives& c, const fit_options& opts, std::size_t samples) = 0;
  virtual fit_position join_as_replacement(const fit_options& opts) = 0;
  virtual void save_current(collectives& c, const fit_options& opts, bool async) = 0;
  virtual io::checkpointer& ckpt() = 0;
  virtual std::size_t planned_bytes(std::size_t batch) const = 0;
  virtual double peak_gflops() = 0;
  virtual std::shared_ptr<const monitor::nvml> device_monitor() = 0;
  virtual fit_position survive(const rank_failure& f, const fit_options& opts, int number, std::string& report) = 0;
  /// After a rank_failure under can_detect: the roll call over the world, the report, and the
  /// end of the job (throws; see detail::end_after_failure).
  [[noreturn]] virtual void end_after_failure(const rank_failure& f, const fit_options& opts) = 0;
  virtual void emergency_checkpoint(const fit_options& opts) noexcept = 0;
  virtual void write_trace(const std::string& path, const monitor::timeline& t) = 0;

 protected:
  ~fit_host() = default;
};

/// What checkpoints (and the emergency checkpoint) need from the typed trainer: its facts and
/// this rank's state, moved through host memory. trainer_body implements it; the checkpoint
/// code itself (trainer_core::record_now, snapshot, save_current, load_checkpoint) is compiled
/// once for every trainer.
class state_host {
 public:
  /// The trainer's facts that a checkpoint records or checks, fixed for its lifetime.
  struct facts {
    const io::network_description* network = nullptr;      ///< io::describe<Network>()
    const std::vector<io::tensor_description>* tensors = nullptr;  ///< its tensors
    std::size_t parameter_count = 0;
    const char* loss = "";
    const char* optimizer = "";
    std::string policy;
    std::uint64_t seed = 0;
    math_mode math = math_mode::fp32;
    float base_lr = 0;
    std::string optimizer_options;  ///< every option, as text (detail::optimizer_options_text)
    bool per_epoch_sums = true;  ///< the engine keeps the epoch's loss sums per replica
  };
  virtual const facts& state_facts() const = 0;
  /// What this rank holds of the parameters, and of the optimizer state where that differs
  /// (shard_optimizer_state; nullopt otherwise).
  virtual shard_map parameter_shard() const = 0;
  virtual std::optional<shard_map> optimizer_shard() const = 0;
  /// Values of this rank's parameters, of its buffers (running statistics), and of each of its
  /// optimizer buffers.
  virtual std::size_t parameter_values() const = 0;
  virtual std::size_t buffer_values() const = 0;
  virtual std::size_t state_values() const = 0;
  /// The names of the optimizer buffers this rank keeps (Optimizer::buffer_names).
  virtual std::vector<std::string> optimizer_buffer_names() = 0;
  /// Copies between this rank's state and host memory: the parameters (n values in), optimizer
  /// buffer i (state_values() values).
  virtual void parameters_to_host(float* dst) = 0;
  virtual void buffers_to_host(float* dst) = 0;
  virtual void buffer_to_host(std::size_t i, float* dst) = 0;
  virtual void parameters_from_host(const float* src, std::size_t n) = 0;
  virtual void buffers_from_host(const float* src, std::size_t n) = 0;
  virtual void buffer_from_host(std::size_t i, const float* src) = 0;
  virtual std::size_t optimizer_steps() = 0;
  virtual void set_optimizer_steps(std::size_t n) = 0;
  /// Host memory of n values for a snapshot, which the previous checkpoint has finished with:
  /// the trainer's page-locked staging buffer on a backend whose memory the host cannot read,
  /// null elsewhere (the snapshot then owns a new host vector).
  virtual float* snapshot_staging(std::size_t n) = 0;
  /// Sums v over the replicas (collective over the world).
  virtual void sum_over_replicas(double* v, std::size_t n) = 0;
  virtual int world_size() const = 0;

 protected:
  ~state_host() = default;
};

/// io::describe<Network>() and its tensors, made once per network type (not per trainer type).
template <class Network>
const io::network_description& described() {
  static const io::network_description d = io::describe<Network>();
  return d;
}
template <class Network>
const std::vector<io::tensor_description>& described_tensors() {
  static const std::vector<io::tensor_description> t = described<Network>().tensors();
  return t;
}

/// trainer::write_trace's files: this rank's own timeline (under several ranks), and on rank 0
/// every rank's (gathered by the engine).
LOOM_DECL void write_rank_trace(const std::string& path, const monitor::timeline& t, int rank, int world);
LOOM_DECL void write_whole_trace(const std::string& path, const std::vector<std::vector<monitor::span_event>>& all,
                                 const std::vector<std::size_t>& dropped);

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

/// The options of the last fit (what a checkpoint records of them).
struct fit_record {
  std::size_t batch = 0, accumulation = 1, epochs = 0, max_steps = 0, deterministic_chunk = 0;
  double clip_grad_norm = 0;
  std::size_t samples = 0;
};

/// The part of loom::trainer that does not depend on its types: where the run is, and fit's
/// loop (epochs, accumulation groups, checkpoints, live figures, recoveries), written once.
class trainer_core {
 protected:
  using position = fit_position;

  /// fit after its checks and the ranks' agreement on the job: trains on `samples` samples as
  /// opts says (loom::trainer::fit). `joining`: this process replaces a lost rank.
  fit_result run_fit(fit_host& h, const fit_options& opts, std::size_t samples, bool joining, std::uint64_t seed,
                     float base_lr);

  /// The record of the current state (collective where the epoch's sums are summed over replicas).
  LOOM_DECL io::trainer_record record_now(state_host& h);
  /// This rank's parameters and optimizer buffers, copied to host memory (state_host::snapshot_staging).
  LOOM_DECL io::rank_snapshot snapshot(state_host& h);
  /// Starts writing a checkpoint of the current state in `directory` (collective; waits for the
  /// previous one first: it may be using the staging memory).
  LOOM_DECL void save_current(state_host& h, collectives& c, const std::filesystem::path& directory, bool async,
                              std::size_t keep, double commit_timeout_s);
  /// Reads a checkpoint (see trainer::load) and applies it; with fit's options, first checks that
  /// the run can continue from it exactly. `log` takes what it did, `warnings` each checkpoint
  /// refused (and then also the one it resumed from). Returns its path (empty when none_ok and
  /// none is there).
  LOOM_DECL std::filesystem::path load_checkpoint(state_host& h, collectives& c, const std::filesystem::path& where,
                                                  bool none_ok, std::ostream* log, std::ostream* warnings,
                                                  const fit_options* opts, std::size_t samples);
  /// The emergency checkpoint of a survivor holding a whole replica (detail::emergency_checkpoint).
  LOOM_DECL void write_emergency_checkpoint(state_host& h, const fit_options& opts, int rank);
  io::checkpointer& ckpt() {
    if (!ckpt_) ckpt_ = std::make_unique<io::checkpointer>();
    return *ckpt_;
  }

  std::size_t step_ = 0;
  float last_lr_ = 0;
  position resume_{}, cur_{};
  fit_record last_fit_{};
  std::string data_identity_;  // data::identity_of the training set of the last fit
  bool watching_ = false;     // failure detection is on in this fit
  fault_marker failed_at_{};  // where the last rank_failure found this rank
  std::string interrupted_lost_;  // the ranks the recovery in progress left out
  std::string fit_description_;   // the fit's options, as the ranks compare them
  std::optional<monitor::clock::time_point> replacement_began_;  // the last replacement's spawn, until its first good step
  bool global_sums_ = false;  // the loss sums are the whole batch's on every rank, step by step
  std::unique_ptr<io::checkpointer> ckpt_;
};

/// Everything of loom::trainer, keyed by the policy whose code it runs (code_policy_t<Policy>):
/// trainers whose policies differ only in run-time facts (a pipeline's micro-batch count and
/// schedule) share it; what they differ in arrives as trainer_facts. See loom::trainer.
template <class Network, class Loss, class Optimizer, class Policy, class Backend>
class trainer_body : private trainer_core, private state_host {
  static_assert(is_network_v<Network>, "loom::trainer's first argument must be a loom::network<loom::input<...>, ...>");
  using traits = detail::engine_for<Network, Loss, Optimizer, Policy, Backend>;
  static_assert(!std::is_same_v<typename traits::type, detail::no_engine_for_policy>,
                "loom::trainer: Policy must be loom::single_process, loom::data_parallel<Comm, ...>, "
                "loom::model_parallel<loom::tensor_parallel<T>, Comm>, loom::hybrid<loom::data_parallel<Comm, ...>, "
                "loom::tensor_parallel<T>>, or a pipeline (loom::model_parallel<loom::pipeline<...>, Comm>, "
                "loom::hybrid<loom::data_parallel<Comm, ...>, loom::pipeline<...>>)");
  // (A pipeline's engine says it for pipelines, in its own words.)
  static_assert(detail::is_pipeline_engine_v<typename traits::type> ||
                    detail::comm_reaches_memory_of<typename traits::comm, Backend>(),
                "loom::trainer: this data_parallel communicator cannot move GPU memory (mpi_comm and local_comm "
                "take host memory): with loom::cuda use loom::data_parallel<loom::nccl_comm> from <loom/comm/nccl.hpp> "
                "(tensor parallelism, too, needs a communicator that moves GPU memory)");

 public:
  /// The engine of Policy (loom::replica_engine or loom::pipeline_engine).
  using engine_type = typename traits::type;
  static_assert(std::is_same_v<engine_type, detail::no_engine_for_policy> || engine<engine_type>,
                "loom::trainer: internal error: the engine of this policy does not satisfy loom::engine");
  using comm_type = typename traits::comm;
  using optimizer_options = typename Optimizer::options;
  using value_type = float;

  /// Trains alone, or on Comm::world() (e.g. loom::mpi_comm under mpirun). Collective.
  explicit trainer_body(trainer_facts<optimizer_options> facts, optimizer_options opt, trainer_options options)
      : facts_(std::move(facts)), options_(options), opt_(opt), init_threads_((set_threads(options.threads), 0)),
        engine_(make_engine()) {}

  /// Trains on `comm` (e.g. a loom::local_comm of a local_world). Collective over comm.
  /// Throws loom::invalid_argument when comm's size does not fit the policy (a pipeline: S
  /// ranks, under hybrid a multiple of S; tensor parallelism: T ranks, under hybrid a multiple
  /// of T) or Backend cannot run options.math; loom::communication_error when the ranks were
  /// built differently (every rank names the fields that differ).
  template <class Comm>
    requires(!std::is_void_v<comm_type> && std::is_same_v<Comm, comm_type>)
  explicit trainer_body(trainer_facts<optimizer_options> facts, Comm comm, optimizer_options opt, trainer_options options)
      : facts_(std::move(facts)), options_(options), opt_(opt), init_threads_((set_threads(options.threads), 0)),
        engine_(make_engine(std::move(comm))) {}

  /// Trains on `data` for opts.epochs epochs (or opts.max_steps optimizer steps in all).
  /// opts.batch is the global batch: split over the replicas (each reads only its share), and
  /// in a pipeline each replica's share into the schedule's micro-batches. The result equals
  /// one process training on the whole batch. Collective over the world.
  /// Throws loom::invalid_argument for a zero batch or accumulation, an empty data set, a
  /// negative or non-finite clip_grad_norm, or a deterministic_chunk the policy cannot run;
  /// loom::communication_error when the ranks were given different options.
  template <class Dataset>
  fit_result fit(const Dataset& data, const fit_options& opts = {}) {
    detail::check_dataset_for<Network, Dataset>();
    detail::check_fit_options(opts, data.size());
    if (opts.fault.replace) detail::check_replace(opts.fault, watches(), replaces(), facts_.name);
    // A replacement of a lost rank (fault_options::replace): the survivors are in their
    // recovery, not here; it checks the job with them as it joins (join_as_replacement).
    const bool joining = replaces() && detail::joining_as_replacement;
    fit_description_ = detail::describe_fit(opts, data.size());
    if (!joining) engine_.check_same_job(fit_description_);
    fit_part<Dataset> part(*this, data);
    data_identity_ = data::identity_of(data);
    fit_result r = run_fit(part, opts, data.size(), joining, options_.seed, detail::base_lr<Optimizer>(opt_));
    // ZeRO leaves the last step's parameter gathers in flight for a next forward: complete
    // them, so that the model is whole when fit returns.
    if constexpr (requires { engine_.settle(); }) engine_.settle();
    return r;
  }

  /// Saves a checkpoint of the current state as `dir`/step-<steps()> (see loom/io/checkpoint.hpp),
  /// and waits until it is committed. Collective. Returns its path. After fit, the position saved
  /// is the end of fit's last epoch. Throws loom::io_error on every rank when any rank's part
  /// cannot be written; nothing is left in its place.
  std::filesystem::path save(const std::filesystem::path& dir) {
    const std::unique_ptr<collectives> coll = make_collectives();
    save_current(*this, *coll, dir, /*async=*/false, /*keep=*/0, 600);
    return dir / ("step-" + std::to_string(step_));
  }

  /// Loads the checkpoint `where` (a step-<n> directory, or the newest valid one in a run's
  /// directory), saved under any policy and world size for this network and optimizer: the
  /// parameters, the optimizer state, the step count, and the position in the data, so that the
  /// next fit continues where the saved run stopped. Collective. Throws loom::io_error on every
  /// rank (naming the file, tensor or field, what was expected and what was found) when no
  /// valid checkpoint is there; nothing is changed then. A newer checkpoint refused in favour of
  /// an older one is named on stderr (rank 0).
  std::filesystem::path load(const std::filesystem::path& where) {
    if (replacement_pending()) return {};  // a replacement takes the survivors' state in fit
    const std::unique_ptr<collectives> coll = make_collectives();
    return load_checkpoint(*this, *coll, where, /*none_ok=*/false, nullptr, &std::cerr, nullptr, 0);
  }

  /// Writes the whole model's weights as one safetensors file (loom::save_weights' format, for
  /// torch.nn.Sequential): rank 0 writes, from the parameters every rank contributes. Collective.
  void save_weights(const std::filesystem::path& path) {
    const std::vector<value_type> whole = gather_parameters();
    const std::unique_ptr<collectives> coll = make_collectives();
    // The buffers (running statistics): replica 0's, the stages' own (collective).
    const std::vector<value_type> buffers = gather_buffers(*coll);
    std::string err;
    if (rank() == 0) {
      try {
        io::save_weights<Network, value_type>(std::span<const value_type>(whole), std::span<const value_type>(buffers),
                                              path);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    if (const std::string all = coll->agree_on_errors(err); !all.empty()) throw io_error(all);
  }

  /// Sets the parameters from a whole-model safetensors file (loom::load_weights' checks): every
  /// rank reads the file and takes the part it holds. Collective; on any rank's error every rank
  /// throws and no parameter changes.
  void load_weights(const std::filesystem::path& path) {
    if (replacement_pending()) return;  // a replacement takes the survivors' state in fit
    io::model_weights<value_type> whole;
    std::string err;
    try {
      whole = io::load_weights_and_buffers<Network, value_type>(path);
    } catch (const std::exception& e) {
      err = e.what();
    }
    const std::unique_ptr<collectives> coll = make_collectives();
    if (const std::string all = coll->agree_on_errors(err); !all.empty()) throw io_error(all);
    const shard_map m = engine_.shard();
    std::vector<value_type> mine(m.local_count);
    copy_from_whole(m, whole.parameters.data(), mine.data());
    from_host(mine.data(), mine.size(), engine_.local_parameters());
    std::vector<value_type> mine_buffers(m.local_buffer_count);
    copy_from_whole(detail::buffer_map(m), whole.buffers.data(), mine_buffers.data());
    from_host(mine_buffers.data(), mine_buffers.size(), engine_.local_buffers());
  }

  /// Mean loss and accuracy of the current parameters on `data`, in evaluation mode: each
  /// replica evaluates its share (through its stages, in a pipeline) and the sums reach every
  /// rank. Collective over the world.
  template <class Dataset>
  eval_result evaluate(const Dataset& data, std::size_t batch = 500) {
    detail::check_dataset_for<Network, Dataset>();
    if (batch == 0) throw invalid_argument("loom::trainer::evaluate: batch must be at least 1, got 0");
    data::loader_for_t<Dataset> loader(data, batch, options_.seed, engine_.replica(), engine_.replicas(),
                                       /*shuffle=*/false);
    loader.start_epoch(0);
    reserve(batch);
    double sums[3] = {0, 0, 0};  // loss, correct, samples
    for (std::size_t k = 0; k < loader.batches_per_epoch(); ++k) {
      const batch_view<value_type> b = next_batch(loader);
      if (b.n == 0) continue;  // the same on every rank of this replica
      const loss_value v = engine_.evaluate_batch(b, options_.seed, step_);
      sums[0] += v.sum;
      sums[1] += static_cast<double>(v.correct);
      sums[2] += static_cast<double>(b.n);
    }
    engine_.end_evaluation();
    engine_.sum(sums, 3);
    eval_result r;
    r.samples = static_cast<std::size_t>(sums[2]);
    if (r.samples) r.loss = sums[0] / sums[2], r.accuracy = sums[1] / sums[2];
    return r;
  }

  /// This rank's model: a loom::model of the whole network (or of its tensor-parallel slice);
  /// in a pipeline a std::variant over the stages' models holding this rank's stage (use
  /// std::visit, or stage_model<S>()).
  decltype(auto) model() noexcept { return engine_.model(); }
  decltype(auto) model() const noexcept { return engine_.model(); }
  /// This rank's optimizer state (of its part of the model).
  decltype(auto) optimizer() noexcept { return engine_.optimizer(); }
  /// Optimizer steps taken so far, over all fit() calls.
  std::size_t steps() const noexcept { return step_; }
  /// This process's rank and the number of ranks, in the whole world (0 and 1 alone).
  int rank() const { return engine_.rank(); }
  int ranks() const { return engine_.world(); }
  /// This rank's model replica and the number of replicas (data parallelism's split).
  int replica() const { return engine_.replica(); }
  int replicas() const { return engine_.replicas(); }
  /// What this rank holds of the whole model (see loom::shard_map).
  shard_map shard() const { return engine_.shard(); }
  engine_type& engine() noexcept { return engine_; }

  /// The pipeline stage this rank runs (pipelines).
  int stage() const
    requires requires(const engine_type& e) { e.stage(); }
  {
    return engine_.stage();
  }
  /// This rank's stage model as its type, when the caller knows the stage (pipelines).
  /// Throws loom::invalid_argument when this rank runs another stage.
  template <std::size_t Stage>
    requires requires { typename engine_type::template stage_model_type<Stage>; }
  auto& stage_model() {
    static_assert(Stage < engine_type::stages, "loom::trainer::stage_model<Stage>: no such stage");
    if (stage() != static_cast<int>(Stage))
      throw invalid_argument("loom::trainer::stage_model<" + std::to_string(Stage) + ">: rank " + std::to_string(rank()) +
                             " runs stage " + std::to_string(stage()) + ", not " + std::to_string(Stage));
    return std::get<Stage>(engine_.models());
  }

  /// The L2 norm of the whole model's parameters, summed in double (split parameters' squares
  /// summed over the model-parallel group, replicated ones counted once). Collective over the
  /// model-parallel group.
  double parameters_l2() { return engine_.parameters_l2(); }

  /// The whole model's flat parameters (Network::parameter_count, Network's layout) as a host
  /// vector, on every rank. Collective over the model-parallel group.
  std::vector<value_type> gather_parameters() { return engine_.gather_parameters(); }

  /// The whole model's buffers (running statistics; Network::buffer_count, its flat buffer of
  /// buffers) as a host vector, on every rank: replica 0's (each replica's are its own), each
  /// stage's from its rank. Collective over the world.
  std::vector<value_type> gather_buffers() {
    const std::unique_ptr<collectives> coll = make_collectives();
    return gather_buffers(*coll);
  }

 private:
  static constexpr bool per_epoch_sums = detail::every_rank_holds_loss<engine_type>();


  std::vector<value_type> gather_buffers(collectives& c) {
    const shard_map m = engine_.shard();
    std::vector<value_type> mine(m.local_buffer_count);
    to_host(engine_.local_buffers(), mine.size(), mine.data());
    return detail::gather_whole_buffers(c, m, mine);
  }

  std::unique_ptr<collectives> make_collectives() {
    if constexpr (requires { engine_.world_comm(); })
      return std::make_unique<comm_collectives<std::remove_cvref_t<decltype(engine_.world_comm())>>>(engine_.world_comm());
    else
      return std::make_unique<solo_collectives>();
  }
  static const io::network_description& network_description() { return described<Network>(); }
  static const std::vector<io::tensor_description>& tensors() { return described_tensors<Network>(); }
  static void to_host(const value_type* src, std::size_t n, value_type* dst) {
    if constexpr (space::host_accessible) {
      if (n) std::memcpy(dst, src, n * sizeof(value_type));
    } else {
      space::copy_to_host(dst, src, n * sizeof(value_type));
    }
  }
  static void from_host(const value_type* src, std::size_t n, value_type* dst) {
    if constexpr (space::host_accessible) {
      if (n) std::memcpy(dst, src, n * sizeof(value_type));
    } else {
      space::copy_from_host(dst, src, n * sizeof(value_type));
    }
  }
  /// Why a failure ends this job instead of a recovery (end_after_failure's report).
  std::string why_no_recovery() const {
    if (sharded_state())
      return "the optimizer state is sharded over the ranks (loom::shard_optimizer_state), and the lost ranks' "
             "slices are gone";
    if (engine_.replicas() > 1) {
      if constexpr (can_watch)
        return "recovery is off (the runtime ends the survivors under plain mpirun: run under loomrun or mpirun "
               "--enable-recovery), and no rank holds a whole model replica to write an emergency checkpoint";
      else
        return "this communicator cannot rebuild itself over the survivors (the hybrids recover in place over "
               "loom::mpi_comm)";
    }
    return "the lost ranks held the only copy of their part of the model (a pipeline stage or a tensor slice)";
  }
  /// Whether the engine keeps the optimizer state of its own slices only (shard_optimizer_state).
  bool sharded_state() const {
    if constexpr (requires { engine_.shards_state(); }) return engine_.shards_state();
    else return false;
  }
  /// Values per optimizer buffer on this rank: the parameters', or the shard's under ZeRO.
  std::size_t state_count() const {
    if constexpr (requires { engine_.state_count(); })
      if (sharded_state()) return engine_.state_count();
    return engine_.local_count();
  }
  /// What loom::memory_plan says this rank needs at its share of a full batch of `batch` (its
  /// stage or slice, its replica's share); 0 where the plan does not apply: a backend other
  /// than loom::cpu, which the plan models (loom::cuda, a test's reference backend).
  std::size_t planned_bytes(std::size_t batch) const {
    if constexpr (!std::is_same_v<Backend, cpu>) {
      return 0;
    } else {
      const std::size_t replicas = static_cast<std::size_t>(engine_.replicas()), i = static_cast<std::size_t>(engine_.replica());
      const std::size_t share = batch * (i + 1) / replicas - batch * i / replicas;
      return facts_.planned ? facts_.planned(opt_, static_cast<std::size_t>(engine_.rank()), share, batch, replicas) : 0;
    }
  }
  /// The optimizer's state buffers here: as many of Optimizer::buffer_names as it keeps.
  std::vector<std::string> buffer_names() {
    const std::size_t n = state_count();
    // A rank holding no parameters (a pipeline stage of activations only) asks a one-value state.
    const std::size_t k = n ? engine_.optimizer().buffers().size() / n
                            : typename Optimizer::template state<value_type, Backend>(opt_, 1).buffers().size();
    std::vector<std::string> out;
    for (std::size_t i = 0; i < k; ++i) out.emplace_back(detail::optimizer_buffer_names<Optimizer>(opt_)[i]);
    return out;
  }
  // detail::state_host: what trainer_core's checkpoint code needs, for this trainer's types.
  const state_host::facts& state_facts() const override {
    state_facts_ = {.network = &network_description(), .tensors = &tensors(), .parameter_count = Network::parameter_count,
                    .loss = Loss::name, .optimizer = detail::optimizer_name<Optimizer>(opt_), .policy = facts_.name, .seed = options_.seed,
                    .math = options_.math, .base_lr = detail::base_lr<Optimizer>(opt_),
                    .optimizer_options = detail::optimizer_options_text<Optimizer>(opt_), .per_epoch_sums = per_epoch_sums};
    return state_facts_;
  }
  shard_map parameter_shard() const override { return engine_.shard(); }
  std::optional<shard_map> optimizer_shard() const override {
    if constexpr (requires { engine_.state_shard(); })
      if (sharded_state()) return engine_.state_shard();
    return std::nullopt;
  }
  std::size_t parameter_values() const override { return engine_.local_count(); }
  std::size_t buffer_values() const override { return engine_.local_buffer_count(); }
  void buffers_to_host(float* dst) override { to_host(engine_.local_buffers(), engine_.local_buffer_count(), dst); }
  void buffers_from_host(const float* src, std::size_t n) override { from_host(src, n, engine_.local_buffers()); }
  std::size_t state_values() const override { return state_count(); }
  std::vector<std::string> optimizer_buffer_names() override { return buffer_names(); }
  void parameters_to_host(float* dst) override { to_host(engine_.local_parameters(), engine_.local_count(), dst); }
  void buffer_to_host(std::size_t i, float* dst) override {
    const std::size_t m = state_count();
    to_host(engine_.optimizer().buffers().data() + i * m, m, dst);
  }
  void parameters_from_host(const float* src, std::size_t n) override { from_host(src, n, engine_.local_parameters()); }
  void buffer_from_host(std::size_t i, const float* src) override {
    const std::size_t m = state_count();
    from_host(src, m, engine_.optimizer().buffers().data() + i * m);
  }
  std::size_t optimizer_steps() override { return engine_.optimizer().steps(); }
  void set_optimizer_steps(std::size_t n) override { engine_.optimizer().set_steps(n); }
  float* snapshot_staging(std::size_t n) override {
    if constexpr (staged) {
      snapshot_stage_.reserve_discard(n);
      return snapshot_stage_.data();
    } else {
      (void)n;
      return nullptr;
    }
  }
  void sum_over_replicas(double* v, std::size_t n) override { engine_.sum(v, n); }
  int world_size() const override { return engine_.world(); }

  static constexpr bool staged = !Backend::memory_space::host_accessible;
  using space = typename Backend::memory_space;
  using staging_space = typename detail::staging_space_of<Backend>::type;
  static constexpr std::size_t in_width = Network::input_shape::size;

  engine_setup<optimizer_options> setup() const {
    return {.seed = options_.seed, .math = options_.math, .optimizer = opt_, .job = job_description(),
            .data_parallel = facts_.data_parallel};
  }
  engine_type make_engine() const {
    if constexpr (std::is_void_v<comm_type>) return traits::make(setup());
    else return make_engine(comm_type::world());
  }
  template <class Comm>
  engine_type make_engine(Comm comm) const {
    if constexpr (detail::is_pipeline_engine_v<engine_type>)
      return traits::make(std::move(comm), setup(), facts_.table.value());  // trainer_facts_of sets it for pipelines
    else
      return traits::make(std::move(comm), setup());
  }

  /// The job every rank must share; the engine adds its policy's own fields.
  std::string job_description() const {
    return detail::describe_job(type_name<Network>(), Network::parameter_count, Loss::name, detail::optimizer_name<Optimizer>(opt_), options_.seed,
                                options_.math, facts_.name);
  }

  /// NVML's view of the device this rank computes on (loom::cuda), or null: on the CPU, or
  /// without NVML (monitor/sampler.hpp). Opened once per process.
  static std::shared_ptr<const monitor::nvml> device_monitor() {
    if constexpr (requires { Backend::pci_bus_id(); }) {
      static const std::shared_ptr<const monitor::nvml> device = [] {
        auto n = std::make_shared<const monitor::nvml>(Backend::pci_bus_id());
        return n->available() ? n : nullptr;
      }();
      return device;
    } else {
      return nullptr;
    }
  }

  /// Writes this rank's timeline (own file under several ranks) and, on rank 0, every rank's
  /// in `path` (collective).
  void write_trace(const std::string& path, const monitor::timeline& t) {
    const int rank = engine_.rank(), world = engine_.world();
    if (world > 1) detail::write_rank_trace(path, t, rank, world);
    std::vector<std::size_t> dropped;
    const auto all = engine_.gather_timelines(t, dropped);
    if (rank == 0) detail::write_whole_trace(path, all, dropped);
  }

  /// Room for a batch of n samples: the samples where the engine reads them, the labels likewise.
  void reserve(std::size_t n) {
    if (engine_.reads_samples()) x_.reserve_discard(n * in_width);
    if (engine_.reads_labels()) labels_.reserve_discard(n);
    if constexpr (staged) {
      if (engine_.reads_samples()) x_stage_.reserve_discard(n * in_width);
      if (engine_.reads_labels()) labels_stage_.reserve_discard(n);
    }
  }

  /// The loader's next batch: the samples into x_ and the labels into labels_ where the engine
  /// reads them (through the staging buffers when the host cannot write the backend's memory).
  template <class Loader>
  batch_view<value_type> next_batch(Loader& loader) {
    const bool xs = engine_.reads_samples(), ls = engine_.reads_labels();
    batch_view<value_type> b;
    if constexpr (!staged) {
      b.n = loader.next(xs ? x_.data() : nullptr, ls ? labels_.data() : nullptr, b.global_n);
    } else {
      // The previous batch's copies must have left the staging buffers; the loss sum of that
      // batch already waited for them, so this returns at once.
      if (xs || ls) Backend::synchronize();
      b.n = loader.next(xs ? x_stage_.data() : nullptr, ls ? labels_stage_.data() : nullptr, b.global_n);
      if (xs) Backend::copy(x_.data(), x_stage_.data(), b.n * in_width);
      if (ls) Backend::copy(labels_.data(), labels_stage_.data(), b.n);
    }
    b.offset = loader.local_offset();
    b.x = xs ? x_.data() : nullptr;
    b.labels = ls ? labels_.data() : nullptr;
    return b;
  }

  using step_clock = detail::step_clock;

  /// Whether this trainer's engine and communicator can detect failures and recover.
  static constexpr bool can_watch = [] {
    if constexpr (requires { engine_type::recoverable; }) {
      if constexpr (engine_type::recoverable)
        return requires(engine_type& e, const recovery_request& q) {
          e.world_comm().watch_for_failures(1.0);
          recover_world(e.world_comm(), q);
        };
      else
        return false;
    } else {
      return false;
    }
  }();

  /// Whether this trainer's engine can detect failures where it cannot recover (pipelines,
  /// tensor parallelism, the hybrids; data parallelism under shard_optimizer_state): deadlines
  /// on every communicator it uses, and a roll call over the world (loom::recover_world without
  /// the rebuild) that names the lost ranks before the job ends.
  static constexpr bool can_detect = requires(engine_type& e, const recovery_request& q, const recovery_result& r) {
    e.watch_for_failures(1.0);
    e.set_deadline(1.0);
    recover_world(e.world_comm(), q);
    fence_left_out(e.world_comm(), r);
  };

  /// Ranks that hold one model replica together: a hybrid's tensor-parallel width or pipeline
  /// stages (its replicas go on or leave whole), 1 otherwise.
  static constexpr int replica_ranks = [] {
    if constexpr (requires { engine_type::replica_ranks; }) return engine_type::replica_ranks;
    else return 1;
  }();

  /// Whether a recovery can also merge new processes in (fault_options::replace): recovery
  /// over loom::mpi_comm (the spawn, the merge and the newcomers' detector are MPI's), under
  /// data_parallel (a hybrid would need a whole replica of new processes).
  static constexpr bool can_replace = [] {
    if constexpr (can_watch && replica_ranks == 1)
      return requires(engine_type& e, const std::vector<std::string>& hosts) {
        spawn_replacements(e.world_comm(), hosts, 1.0);
        e.world_comm().watch_deadlines_only(1.0);
      };
    else
      return false;
  }();

  /// The trainer's part in fit's loop (detail::trainer_core::run_fit): its engine, the loader
  /// of `data` and its state, behind detail::fit_host.
  template <class Dataset>
  struct fit_part final : detail::fit_host {
    fit_part(trainer_body& t, const Dataset& data) : t_(t), data_(data) {
      can_watch = t.watches();
      can_replace = t.replaces();
      can_detect = trainer_body::can_detect && !can_watch;
      per_epoch_sums = trainer_body::per_epoch_sums;
      ends_without_recovery = trainer_body::can_detect && replica_ranks > 1;
    }
    int rank() const override { return t_.engine_.rank(); }
    int world() const override { return t_.engine_.world(); }
    int replica() const override { return t_.engine_.replica(); }
    int replicas() const override { return t_.engine_.replicas(); }
    std::size_t prepare_fit(std::size_t batch, std::size_t chunk) override { return t_.engine_.prepare_fit(batch, chunk); }
    void reset_figures() override { t_.engine_.reset_figures(); }
    rank_figures& figures() override { return t_.engine_.figures(); }
    std::vector<rank_figures> gather_figures() override { return t_.engine_.gather_figures(); }
    double flops_per_sample() const override { return static_cast<double>(t_.engine_.flops_per_sample()); }
    loss_value micro_step(const batch_view<float>& b, std::size_t m, std::size_t group, std::uint64_t seed,
                          std::uint64_t salt) override {
      return t_.engine_.micro_step(b, m, group, seed, salt);
    }
    void sum(double* v, std::size_t n) override { t_.engine_.sum(v, n); }
    void optimizer_step(float lr, double clip) override { t_.engine_.optimizer_step(lr, clip); }
    void set_step_commit(bool on) override {
      if constexpr (requires { t_.engine_.set_step_commit(on); }) t_.engine_.set_step_commit(on);
    }
    void watch_for_failures(double deadline_s) override {
      if constexpr (trainer_body::can_detect) t_.engine_.watch_for_failures(deadline_s);
      else if constexpr (trainer_body::can_watch) t_.engine_.world_comm().watch_for_failures(deadline_s);
    }
    void set_deadline(double deadline_s) override {
      if constexpr (trainer_body::can_detect) t_.engine_.set_deadline(deadline_s);
      else if constexpr (trainer_body::can_watch) t_.engine_.world_comm().set_deadline(deadline_s);
    }
    std::string watch_job_id() override {
      if constexpr (trainer_body::can_watch) return t_.engine_.world_comm().watch()->job_id;
      else return {};
    }
    void open_loader(std::size_t batch) override {
      loader_.emplace(data_, batch, t_.options_.seed, t_.engine_.replica(), t_.engine_.replicas());
    }
    void set_rank_block(std::size_t block) override { loader_->set_rank_block(block); }
    void reshard(int replica, int replicas) override { loader_->reshard(replica, replicas); }
    void start_epoch(std::size_t epoch) override { loader_->start_epoch(epoch); }
    void skip(std::size_t batches) override { loader_->skip(batches); }
    std::size_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
    void reserve(std::size_t batch) override { t_.reserve(batch); }
    batch_view<float> next_batch() override { return t_.next_batch(*loader_); }
    std::unique_ptr<collectives> make_collectives() override { return t_.make_collectives(); }
    void load_checkpoint(collectives& c, const fit_options& opts, std::size_t samples) override {
      t_.load_checkpoint(t_, c, opts.checkpoint.directory, /*none_ok=*/true, opts.progress, opts.warnings, &opts,
                         samples);
    }
    detail::fit_position join_as_replacement(const fit_options& opts) override {
      if constexpr (trainer_body::can_replace) return t_.join_as_replacement(opts);
      else return {};
    }
    void save_current(collectives& c, const fit_options& opts, bool async) override {
      const checkpoint_options& co = opts.checkpoint;
      t_.save_current(t_, c, co.directory, async, co.keep, co.commit_timeout_s);
    }
    io::checkpointer& ckpt() override { return t_.ckpt(); }
    std::size_t planned_bytes(std::size_t batch) const override { return t_.planned_bytes(batch); }
    double peak_gflops() override { return monitor::measure_peak_gflops<Backend>(); }
    std::shared_ptr<const monitor::nvml> device_monitor() override { return trainer_body::device_monitor(); }
    detail::fit_position survive(const rank_failure& f, const fit_options& opts, int number, std::string& report) override {
      return t_.survive(f, opts, number, report);
    }
    [[noreturn]] void end_after_failure(const rank_failure& f, const fit_options& opts) override {
      if constexpr (trainer_body::can_detect)
        detail::end_after_failure(t_.engine_.world_comm(), f, opts.fault, opts.checkpoint.directory, t_.step_,
                                  t_.failed_at_, t_.why_no_recovery());
      throw f;
    }
    void emergency_checkpoint(const fit_options& opts) noexcept override { t_.emergency_checkpoint(opts); }
    void write_trace(const std::string& path, const monitor::timeline& tl) override { t_.write_trace(path, tl); }

   private:
    trainer_body& t_;
    const Dataset& data_;
    std::optional<data::loader_for_t<Dataset>> loader_;
  };

  /// The trainer's part in a recovery (loom/train/recovery.hpp), over the engine's communicator C.
  template <class C>
  struct recovery_part final : detail::recovery_host<C> {
    explicit recovery_part(trainer_body& t) : t_(t) {}
    C& world_comm() override { return t_.engine_.world_comm(); }
    void after_recovery() override { t_.engine_.after_recovery(); }
    void broadcast_state(C& comm, int root) override { t_.broadcast_state(comm, root); }
    std::size_t step() const override { return t_.step_; }
    detail::fit_position position() const override { return t_.continue_from(); }
    std::string joined_description() const override { return t_.joined_description(); }
    int replica_ranks() const override { return trainer_body::replica_ranks; }
    bool finish_committed_step() override {
      if constexpr (requires { t_.engine_.finish_committed_step(); }) return t_.engine_.finish_committed_step();
      else return false;
    }

   private:
    trainer_body& t_;
  };
  template <class E>
  using recovery_part_of = recovery_part<std::remove_cvref_t<decltype(std::declval<E&>().world_comm())>>;

  /// After a rank_failure under recovery (detail::survive): the survivors rebuild the world,
  /// take the state of the one ahead and go on with the same global batch on fewer ranks (and
  /// bring replacements in, with fault_options::replace). Returns the position to continue
  /// from; sets `report` to the line printed after the first good step.
  position survive(const rank_failure& f, const fit_options& opts, int number, std::string& report) {
    if constexpr (!can_watch) {
      throw f;
    } else {
      if (!watches()) throw f;
      recovery_part_of<engine_type> part(*this);
      return detail::survive(part, f, opts.fault, opts.checkpoint.directory, number, failed_at_, ckpt_.get(),
                             interrupted_lost_, report, replacement_began_);
    }
  }

  /// Whether this process replaces a lost rank and has not joined yet (its first fit joins).
  bool replacement_pending() const { return watches() && detail::joining_as_replacement; }

  /// Whether this run can detect failures and recover (the code can, can_watch, and the run
  /// does not shard the optimizer state), and also replace lost ranks.
  bool watches() const {
    if constexpr (!can_watch) return false;
    else if constexpr (requires { engine_.can_recover(); }) return engine_.can_recover();
    else return true;
  }
  bool replaces() const { return can_replace && watches(); }

  /// What a replacement must share with the survivors: the trainer's job and the fit's options.
  std::string joined_description() const { return job_description() + ";" + fit_description_; }

  /// The step count, position, learning rate, parameters and optimizer buffers of rank root to
  /// every rank of comm (collective).
  template <class Comm>
  void broadcast_state(Comm& comm, int root) {
    double head[10] = {static_cast<double>(step_), static_cast<double>(engine_.optimizer().steps()),
                       static_cast<double>(cur_.valid), static_cast<double>(cur_.epoch),
                       static_cast<double>(cur_.batch), static_cast<double>(cur_.batches),
                       cur_.sums[0], cur_.sums[1], cur_.sums[2], static_cast<double>(last_lr_)};
    comm.broadcast(head, 10, root);
    auto bufs = engine_.optimizer().buffers();
    if constexpr (requires { engine_.replica_comm(); }) {
      // A hybrid: each slice's (stage's) parameters and optimizer state over the replicas of
      // it (the recovery has brought them all to the same step).
      auto& replicas = engine_.replica_comm();
      replicas.broadcast(engine_.local_parameters(), engine_.local_count(), 0);
      replicas.broadcast(bufs.data(), bufs.size(), 0);
      if (engine_.local_buffer_count()) replicas.broadcast(engine_.local_buffers(), engine_.local_buffer_count(), 0);
    } else {
      comm.broadcast(engine_.local_parameters(), engine_.local_count(), root);
      comm.broadcast(bufs.data(), bufs.size(), root);
      if (engine_.local_buffer_count()) comm.broadcast(engine_.local_buffers(), engine_.local_buffer_count(), root);
    }
    step_ = static_cast<std::size_t>(head[0]);
    engine_.optimizer().set_steps(static_cast<std::size_t>(head[1]));
    cur_ = {.valid = head[2] != 0, .epoch = static_cast<std::size_t>(head[3]), .batch = static_cast<std::size_t>(head[4]),
            .batches = static_cast<std::size_t>(head[5]), .sums = {head[6], head[7], head[8]}};
    last_lr_ = static_cast<float>(head[9]);
  }
  /// Where to continue from the current position (an epoch that had just ended: the next).
  position continue_from() const { return cur_.next(); }

  /// A replacement's first fit (fault_options::replace; detail::join_as_replacement): joins the
  /// survivors waiting in their recovery and returns where to continue.
  position join_as_replacement(const fit_options& opts) {
    recovery_part_of<engine_type> part(*this);
    return detail::join_as_replacement(part, opts.fault);
  }

  /// When no recovery is possible: a survivor holding a whole replica writes the state after
  /// the last step it finished as a checkpoint on its own (detail::emergency_checkpoint), so
  /// that plain mpirun loses no step. Never throws; says on stderr what it did.
  void emergency_checkpoint(const fit_options& opts) noexcept {
    const checkpoint_options& co = opts.checkpoint;
    if (co.directory.empty() || !co.on_signal || !opts.fault.emergency_checkpoint || !global_sums_) return;
    if (sharded_state()) {
      std::fprintf(stderr,
                   "loom: rank %d: no emergency checkpoint of step %zu: the optimizer state is sharded over the ranks "
                   "(loom::shard_optimizer_state) and no survivor holds all of it; resume from the last periodic "
                   "checkpoint\n",
                   rank(), step_);
      std::fflush(stderr);
      return;
    }
    // (A hybrid ends with a roll call instead, fit_host::ends_without_recovery: no rank holds
    // a whole replica.)
    if constexpr (can_watch && replica_ranks == 1) write_emergency_checkpoint(*this, opts, rank());
  }

  trainer_facts<optimizer_options> facts_;
  trainer_options options_;
  optimizer_options opt_;
  int init_threads_;
  engine_type engine_;
  buffer<value_type, space> x_;              // (batch, input)
  buffer<std::int32_t, space> labels_;       // (batch)
  buffer<value_type, staging_space> x_stage_;  // (batch, input) on the host; empty unless staged
  buffer<std::int32_t, staging_space> labels_stage_;
  buffer<value_type, staging_space> snapshot_stage_;  // checkpoints' host copy; empty unless staged
  mutable state_host::facts state_facts_;             // state_facts(), made again on each call
};
}  // namespace detail

/// Trains Network with Loss and Optimizer under Policy on Backend (see detail::trainer_body for
/// the members, which are all of this class's but its constructors). Policy is one of
/// loom::single_process (the default), loom::data_parallel<Comm, ...>,
/// loom::model_parallel<loom::pipeline<S, ...>, Comm>, loom::model_parallel<loom::tensor_parallel<T>, Comm>,
/// loom::hybrid<loom::data_parallel<Comm, ...>, loom::pipeline<S, ...>> or
/// loom::hybrid<loom::data_parallel<Comm, ...>, loom::tensor_parallel<T>>.
///
/// Compile time: the members are compiled once per detail::code_policy_t<Policy>, so the
/// micro-batch counts and schedules of one pipeline cut share them (their tables are verified
/// here, at compile time, and handed over as data).
template <class Network, class Loss, class Optimizer, class Policy = single_process, class Backend = cpu>
class trainer : public detail::trainer_body<Network, Loss, Optimizer, detail::code_policy_t<Policy>, Backend> {
  using body = detail::trainer_body<Network, Loss, Optimizer, detail::code_policy_t<Policy>, Backend>;
  using comm_ = typename body::comm_type;
  // (The shared body takes data_parallel's wire format at run time: checked here, on Policy.)
  static_assert(detail::data_parallel_choice_of<Policy>().wire == gradient_wire::native ||
                    Backend::memory_space::host_accessible,
                "loom::compress<>: compressed gradients are converted in host memory; this backend's gradients are "
                "not (loom::cuda): drop compress<> for now");
  static constexpr bool chooses_ = detail::chooses_at_run_time_v<Policy>;
  static detail::trainer_facts<typename Optimizer::options> facts(const data_parallel_choice& choice = {}) {
    if constexpr (chooses_) return detail::trainer_facts_of_choice<Network, Optimizer, Policy, Backend>(choice);
    else return detail::trainer_facts_of<Network, Optimizer, Policy, Backend>();
  }

 public:
  using optimizer_options = typename Optimizer::options;
  using policy_type = Policy;

  /// Trains alone, or on Comm::world() (e.g. loom::mpi_comm under mpirun). Collective.
  explicit trainer(optimizer_options opt = {}, trainer_options options = {})
    requires(std::is_void_v<comm_> || requires { comm_::world(); })
      : body(facts(), opt, options) {}

  /// Under loom::data_parallel<Comm, ..., loom::choose_at_run_time>: trains on Comm::world()
  /// with the wire format and ZeRO that `choice` names (without it: float gradients, no ZeRO),
  /// bitwise as the policy that names them would. Every rank must choose alike: the job check
  /// names the policy field that differs. Throws loom::invalid_argument for a choice the
  /// communicator (ZeRO needs ireduce_scatter_v) or the backend (compression: host memory)
  /// cannot run. Collective.
  trainer(optimizer_options opt, trainer_options options, const data_parallel_choice& choice)
    requires(chooses_ && requires { comm_::world(); })
      : body(facts(choice), opt, options) {}
  /// The same on `comm`. Collective over comm.
  template <class Comm>
    requires(chooses_ && std::is_same_v<Comm, comm_>)
  trainer(Comm comm, optimizer_options opt, trainer_options options, const data_parallel_choice& choice)
      : body(facts(choice), std::move(comm), opt, options) {}

  /// Trains on `comm` (e.g. a loom::local_comm of a local_world). Collective over comm.
  /// Throws loom::invalid_argument when comm's size does not fit the policy (a pipeline: S
  /// ranks, under hybrid a multiple of S; tensor parallelism: T ranks, under hybrid a multiple
  /// of T) or Backend cannot run options.math; loom::communication_error when the ranks were
  /// built differently (every rank names the fields that differ).
  template <class Comm>
    requires(!std::is_void_v<comm_> && std::is_same_v<Comm, comm_>)
  explicit trainer(Comm comm, optimizer_options opt = {}, trainer_options options = {})
      : body(facts(), std::move(comm), opt, options) {}
};

// The instantiations of the trainer's parts that depend on neither the network nor the policy,
// for loom's own types: compiled once in loom_compiled (the CPU backend's float) and
// loom_compiled_mpi (loom::mpi_comm) under separate compilation, rather than in every program
// (LOOM_INSTANTIATE, loom/core/config.hpp). Where the CPU backend is not built, none.
#if LOOM_HAS_DNNL && !defined(LOOM_WITHOUT_CPU_BACKEND) && !defined(__CUDACC__)
LOOM_INSTANTIATE(class gradient_tree<float, cpu>)
LOOM_INSTANTIATE(class chunk_exchange<float, cpu>)
LOOM_INSTANTIATE(class detail::chunked_steps<float, cpu>)
LOOM_INSTANTIATE(loss_value detail::chunked_steps<float, cpu>::step<void>(
    const chunk_plan&, const batch_view<float>&, std::size_t, std::size_t, void*, std::size_t, std::size_t, float*,
    std::size_t, std::size_t, rank_figures&, detail::chunk_passes<float>&))
LOOM_INSTANTIATE(class sgd::state<float, cpu>)
LOOM_INSTANTIATE(class detail::adam_state<adam, float, cpu>)
LOOM_INSTANTIATE(class detail::adam_state<adamw, float, cpu>)
LOOM_INSTANTIATE(class any_optimizer::state<float, cpu>)
LOOM_INSTANTIATE(math_mode detail::checked_math<cpu>(math_mode))
LOOM_INSTANTIATE(double monitor::measure_peak_gflops<cpu>(std::size_t, double))
#if defined(LOOM_SEPARATE_COMPILATION_MPI)
class mpi_comm;
LOOM_INSTANTIATE_MPI(double chunk_exchange<float, cpu>::run<mpi_comm>(mpi_comm&, const chunk_plan&, std::size_t,
                                                                      const gradient_tree<float, cpu>&, float*, std::size_t))
LOOM_INSTANTIATE_MPI(loss_value detail::chunked_steps<float, cpu>::step<mpi_comm>(
    const chunk_plan&, const batch_view<float>&, std::size_t, std::size_t, mpi_comm*, std::size_t, std::size_t, float*,
    std::size_t, std::size_t, rank_figures&, detail::chunk_passes<float>&))
#endif
#endif
#if defined(LOOM_SEPARATE_COMPILATION_MPI)
class mpi_comm;
LOOM_INSTANTIATE_MPI(class comm_collectives<mpi_comm>)
LOOM_INSTANTIATE_MPI(void detail::check_same_job<mpi_comm>(mpi_comm&, const std::string&, const std::string&))
LOOM_INSTANTIATE_MPI(std::vector<rank_figures> gather_figures<mpi_comm>(mpi_comm&, const rank_figures&))
LOOM_INSTANTIATE_MPI(std::vector<std::vector<monitor::span_event>> monitor::gather_timelines<mpi_comm>(
    mpi_comm&, const monitor::timeline&, std::vector<std::size_t>&))
LOOM_INSTANTIATE_MPI(std::string detail::join_exchange<mpi_comm>(mpi_comm&, mpi_comm&, bool, const fault_options&,
                                                                 const std::string&))
LOOM_INSTANTIATE_MPI(void detail::bring_replacements<mpi_comm>(detail::recovery_host<mpi_comm>&, const recovery_result&,
                                                               const fault_options&, int, std::string&,
                                                               std::optional<monitor::clock::time_point>&))
LOOM_INSTANTIATE_MPI(detail::fit_position detail::survive<mpi_comm>(
    detail::recovery_host<mpi_comm>&, const rank_failure&, const fault_options&, const std::string&, int,
    const fault_marker&, io::checkpointer*, std::string&, std::string&, std::optional<monitor::clock::time_point>&))
LOOM_INSTANTIATE_MPI(detail::fit_position detail::join_as_replacement<mpi_comm>(detail::recovery_host<mpi_comm>&,
                                                                                const fault_options&))
#endif

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/train/impl/trainer.ipp"
#endif
