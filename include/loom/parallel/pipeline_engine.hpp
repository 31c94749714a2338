// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::pipeline_engine: the run-time half of pipeline model parallelism, and the engine
// (loom/parallel/engine.hpp) the trainer drives for pipelines. One rank runs one stage: it
// holds only that stage's model (parameters and gradients) and optimizer state, and executes
// the stage's schedule table (loom/parallel/pipeline_plan.hpp) each step: forwards and
// backwards of the micro-batches, activations sent forward and their gradients back with
// non-blocking sends and receives. Under loom::hybrid it also averages its stage's gradients
// over the replicas with a gradient_allreduce. The fit loop around it is loom::trainer
// (loom/train/trainer.hpp); no communicator is included here.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loom/backend/default_backend.hpp"
#include "loom/backend/kernels/optim.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/type_name.hpp"
#include "loom/nn/describe.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/clip.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/pipeline_plan.hpp"
#include "loom/parallel/shard_map.hpp"
#include "loom/parallel/step_commit.hpp"

namespace loom {

namespace detail {
/// Stands for "no data parallelism over the replicas" in pipeline_engine's DataParallel.
struct no_data_parallel {};

/// The first sample of micro-batch m when n samples are cut into M micro-batches: sizes
/// n m / M .. n (m + 1) / M differ by at most one (some are empty when n < M).
constexpr std::size_t micro_batch_begin(std::size_t n, std::size_t m, std::size_t M) { return n * m / M; }

/// A schedule's tables as the stages run them: data, not types, so that one pipeline_stages
/// serves every micro-batch count and schedule of a network cut into the same stages (the
/// tables themselves stay compile-time values, verified by loom::pipeline).
struct pipeline_run_table {
  std::size_t micro_batches = 1;
  std::span<const pipeline_op> ops;         // every stage's operations, stage by stage
  std::span<const std::size_t> op_begin;    // stage s's are ops[op_begin[s], op_begin[s + 1])
  std::string schedule_name;                // as the job description names it
  std::span<const pipeline_op> ops_of(std::size_t s) const { return ops.subspan(op_begin[s], op_begin[s + 1] - op_begin[s]); }

  template <class Pipeline>
  static pipeline_run_table of() {
    using table = typename Pipeline::schedule;
    return {Pipeline::micro_batch_count, std::span<const pipeline_op>(table::ops),
            std::span<const std::size_t>(table::op_begin), type_name<typename Pipeline::schedule_policy>()};
  }
};

/// The part of a pipeline that decides its stages (the stage count and the cut points): the
/// Pipeline pipeline_stages is built on, so that micro-batch counts and schedules share it.
template <class Pipeline>
struct stage_cut_of;
template <std::size_t S, class... O>
struct stage_cut_of<pipeline<S, O...>> {
  using type = std::conditional_t<(is_cut_at<O>::value || ...), pipeline<S, first_of<is_cut_at, void, O...>>, pipeline<S>>;
};

}  // namespace detail

/// Runs one rank's stage of Network cut by Pipeline (a loom::pipeline<S, ...>) with Loss on
/// Backend, over communicator Comm; DataParallel is a loom::data_parallel<Comm, ...> under
/// loom::hybrid (detail::no_data_parallel otherwise): everything of pipeline_engine but the
/// optimizer, so that trainers of one pipeline with different optimizers share its code (the
/// examples build both SGD and Adam: this halves what they compile). Pipeline decides only the
/// stages (pipeline_engine passes detail::stage_cut_of: the stage count and cut points); the
/// micro-batch count and the schedule's tables come at run time (detail::pipeline_run_table), so
/// that every micro-batch count and schedule of one cut shares this code too.
///
/// Ranks: with no data parallelism the world has exactly S ranks and rank s runs stage s; under
/// hybrid, world rank r runs stage r % S of replica r / S (see loom/parallel/hybrid.hpp). The
/// world is split twice: pipeline groups (colour r / S) carry activations and their gradients,
/// data-parallel groups (colour r % S) the gradient allreduces of one stage.
///
/// Memory: the stage's parameters and gradients (model()), and one activation slot per
/// micro-batch alive at once (forwarded, backward not yet run), created on demand and reused:
/// as many as the schedule's peak_live_activations(stage). A slot holds what the stage's
/// forward keeps for backward (its input when received from the previous stage, and each
/// layer's output) plus the gradients passing through. Slots only grow (to the largest
/// micro-batch, or evaluate's batch, seen): the saved-activation bytes they hold are the
/// figure peak_activation_bytes.
///
/// Messages: micro-batch m's activations go to stage s + 1 with tag 2m, their gradients back to
/// s with tag 2m + 1. Every send is non-blocking and completes later (before its slot is reused,
/// and at the end of the step), so a stage computes while its sends drain; a receive is posted
/// when the table reaches it and waited for before the next pass. posted_with_next (a send and
/// the receive after it, to one neighbour) posts both before waiting; the send is then not
/// waited for at once but, as every send, later. Time blocked in those waits is the stage's
/// bubble.
///
/// GPU backends (loom::cuda): slots, messages and the batch views are device memory, moved by
/// a communicator that moves device memory (loom::nccl_comm, whose isend / irecv start as one
/// NCCL group at the next wait: the verified schedule posts each channel's messages in the
/// same order on both ends, which NCCL, carrying no tags, needs). Messages of no samples go
/// through host memory on both ends. Scalars (loss sums, norms, job checks) and
/// gather_parameters go through host copies.
///
/// ZeRO stage 1 (hybrid<data_parallel<Comm, ..., shard_optimizer_state>, pipeline<...>>): each
/// stage's gradients are reduce-scattered over the stage's replicas (its data-parallel group),
/// bucket by bucket during the last backward, into this rank's slices (state_shard()); the
/// optimizer state holds those slices only, about 1/replicas of the stage's. The step clips
/// with the whole model's norm (every rank's slice squares summed over the world: the slices
/// of a stage's replicas hold each of its parameters once), steps the slices where they lie,
/// and leaves the parameters' allgathers in flight; the step's first forward waits for each
/// layer's gather as it reaches it (so that on later stages the wait overlaps the one for
/// activations), and everything else that reads or writes the parameters settles them first.
/// A lost rank takes its slices with it: such a run is not recovered in place (can_recover).
template <class Network, class Loss, class Backend, class Pipeline, class Comm,
          class DataParallel = detail::no_data_parallel>
class pipeline_stages {
 public:
  using value_type = float;
  using T = value_type;

  static_assert(is_pipeline_v<Pipeline>, "loom::pipeline_engine: Pipeline must be a loom::pipeline<Stages, ...>");
  static_assert(communicator<Comm>,
                "loom::pipeline_engine: Comm must be a loom communicator (loom::mpi_comm, loom::local_comm, "
                "loom::nccl_comm)");
  static_assert(detail::comm_reaches_memory_of<Comm, Backend>(),
                "loom::pipeline_engine: pipeline stages exchange activations in GPU memory, which this "
                "communicator cannot move (mpi_comm and local_comm take host memory): with loom::cuda use "
                "loom::nccl_comm from <loom/comm/nccl.hpp>, or train on loom::cpu");

 public:
  using partition = stage_partition<Network, Pipeline>;
  static constexpr std::size_t stages = Pipeline::stages;
  static constexpr bool hybrid = !std::is_same_v<DataParallel, detail::no_data_parallel>;
  /// ZeRO stage 1: the hybrid's data_parallel names loom::shard_optimizer_state (a hybrid
  /// fixes it at compile time: no run-time choice).
  static constexpr bool may_shard_state = hybrid && detail::shards_state_of_v<DataParallel>;
  using request = typename Comm::request;

  /// Stage I's model type: its own network, initialised as layers bounds[I].. of the whole.
  template <std::size_t I>
  using stage_model_type = ::loom::model<typename partition::template stage_network<I>, T, Backend>;

 private:
  template <std::size_t... I>
  static auto models_of(std::index_sequence<I...>) -> std::variant<stage_model_type<I>...>;

 public:
  /// One of the stage models, the one of this rank's stage (index = stage).
  using models_type = decltype(models_of(std::make_index_sequence<stages>{}));

 private:
  using space = typename Backend::memory_space;

  /// What stage I holds besides its model: the activation slots and, under hybrid, the engine
  /// that averages its gradients over the replicas.
  template <std::size_t I>
  struct stage_state {
    static constexpr std::size_t index = I;
    using net = typename partition::template stage_network<I>;
    using seq_type = typename net::template sequence_type<T, Backend>;
    using in_shape = typename net::input_shape;
    using out_shape = typename net::output_shape;
    static constexpr std::size_t in_size = in_shape::size, out_size = out_shape::size;
    static constexpr bool first = I == 0, last = I + 1 == stages;
    /// Elements per sample a slot keeps for backward: the received input, the layers' outputs
    /// (a fused ReLU has none) and what the layers keep themselves (their footprint's saved:
    /// layer_norm's statistics, a batch norm's fused ReLU mask).
    static constexpr std::size_t saved_per_sample =
        (first ? 0 : in_size) +
        detail::elements_of_sequence<typename net::chain, Backend>({.needs_input_gradient = !first}).saved;
    using dp_engine = std::conditional_t<hybrid, gradient_allreduce<net, T, DataParallel>, detail::no_data_parallel>;
    static_assert(!detail::compresses_v<dp_engine> || Backend::memory_space::host_accessible,
                  "loom::compress<>: compressed gradients are converted in host memory; this backend's gradients are "
                  "not (loom::cuda): drop compress<> for now");

    /// One micro-batch's activations and the gradients passing through its backward.
    struct slot {
      explicit slot(std::size_t first_layer) : seq(0, first_layer) {}
      seq_type seq;
      typename Backend::layout_converter conv;
      buffer<T, space> input;      // (n, in_size): received from stage I - 1
      buffer<T, space> dy;         // (n, out_size): the output's gradient, plain
      buffer<T, space> dy_layout;  // (n, out_size): the same in the output's layout, when not plain
      buffer<T, space> dx;         // (n, in_size): the input's gradient, sent to stage I - 1
      const T* x = nullptr;        // the forward's input
      const T* y = nullptr;        // the forward's output, plain
      typename Backend::format y_format{};
      std::size_t n = 0, capacity = 0;
      bool busy = false;
      std::vector<request> sends;  // pending sends out of this slot's buffers
    };

    stage_state(std::optional<Comm> dp_comm, std::size_t micro_batches) : slot_of(micro_batches, none) {
      if constexpr (hybrid) dp.emplace(std::move(*dp_comm));
    }

    static constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::vector<std::unique_ptr<slot>> slots;  // stable addresses: requests point into them
    std::vector<std::size_t> slot_of;          // (micro_batches): each micro-batch's slot
    std::optional<dp_engine> dp;
  };

  template <std::size_t... I>
  static auto states_of(std::index_sequence<I...>) -> std::variant<stage_state<I>...>;
  using states_type = decltype(states_of(std::make_index_sequence<stages>{}));

  template <std::size_t I = 0>
  static models_type make_model(std::size_t stage, std::uint64_t seed) {
    if constexpr (I + 1 < stages)
      if (stage != I) return make_model<I + 1>(stage, seed);
    return models_type(std::in_place_index<I>, seed, partition::bounds[I]);
  }
  template <std::size_t I = 0>
  static states_type make_state(std::size_t stage, std::optional<Comm>& dp_comm, std::size_t micro_batches) {
    if constexpr (I + 1 < stages)
      if (stage != I) return make_state<I + 1>(stage, dp_comm, micro_batches);
    return states_type(std::in_place_index<I>, std::move(dp_comm), micro_batches);
  }

 public:
  /// Checks that every rank of `world` describes its job as `job` plus the pipeline's fields
  /// (key=value; see detail::check_same_job), joins the ranks into pipelines (and, under
  /// hybrid, data-parallel groups) and builds this rank's stage, initialised from seed as that
  /// part of the whole model would be; its passes run in precision `math`. Under hybrid, every
  /// replica of a stage starts from replica 0's parameters. Collective over world.
  /// Throws loom::communication_error when the ranks' jobs differ, loom::invalid_argument when
  /// the world does not have S ranks (hybrid: a multiple of S) or Backend cannot run math; on
  /// every rank alike.
  /// `table`: the schedule's tables (detail::pipeline_run_table::of<loom::pipeline<...>>()).
  pipeline_stages(Comm world, std::uint64_t seed, math_mode math, const std::string& job, detail::pipeline_run_table table)
      : table_(std::move(table)),
        world_(std::move(world)),
        stage_(checked_stage(world_, job)),
        math_(detail::checked_math<Backend>(math)),
        replica_(world_.rank() / static_cast<int>(stages)), replicas_(world_.size() / static_cast<int>(stages)),
        pipe_(world_.split(replica_, world_.rank())), models_(make_model(static_cast<std::size_t>(stage_), seed)),
        states_(make_state_from_world()) {
    if (pipe_.size() != static_cast<int>(stages) || pipe_.rank() != stage_)
      throw communication_error("loom::pipeline: internal error: rank " + std::to_string(world_.rank()) +
                                " expected stage " + std::to_string(stage_) + " of " + std::to_string(stages) +
                                " in its pipeline group, found rank " + std::to_string(pipe_.rank()) + " of " +
                                std::to_string(pipe_.size()));
    figures_.stage = stage_;
    figures_.replica = replica_;
    broadcast_parameters();
    if constexpr (may_shard_state) bind_shard();
  }

  /// The pipeline's own fields of the job description (every rank must agree on them).
  std::string job_fields() const {
    std::string bounds;
    for (std::size_t b : partition::bounds) {
      if (!bounds.empty()) bounds += ',';
      bounds += std::to_string(b);
    }
    return std::string(";replicated=") + (hybrid ? "yes" : "no") + ";stages=" + std::to_string(stages) +
           ";micro_batches=" + std::to_string(table_.micro_batches) + ";schedule=" + table_.schedule_name +
           ";bounds=" + bounds;
  }

  /// Only one rank of the pipeline holds the loss: the last stage's.
  static constexpr bool every_rank_holds_loss = false;

  int rank() const { return world_.rank(); }
  int world() const { return world_.size(); }
  int stage() const { return stage_; }
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ + 1 == static_cast<int>(stages); }
  /// The first stage reads the samples, the last one the labels.
  bool reads_samples() const { return first_stage(); }
  bool reads_labels() const { return last_stage(); }
  /// This rank's stage of the whole network's layout (shards::stage), as its replica.
  shard_map shard() const { return shard_of(std::make_index_sequence<stages>{}); }
  /// Whether the optimizer state holds this rank's slices of its stage only (ZeRO stage 1).
  bool shards_state() const noexcept { return may_shard_state; }
  /// What this rank holds of the optimizer state: the same as shard(), or under ZeRO its
  /// slices of the stage (one block per bucket, at their places in the whole network's layout),
  /// every rank as replica 0 of 1: together the stage's replicas hold the one copy.
  shard_map state_shard() const {
    shard_map m = shard();
    if constexpr (may_shard_state) {
      m.replica = 0;
      m.replicas = 1;
      m.local_count = state_count();
      m.pieces = state_pieces_;
    }
    return m;
  }
  /// Values per buffer of the optimizer state: the stage's parameters, or under ZeRO the
  /// values of this rank's slices.
  std::size_t state_count() const {
    if constexpr (may_shard_state) return std::visit([](const auto& st) { return st.dp->zero().shard_count; }, states_);
    else return parameter_count();
  }
  /// ZeRO: waits for the parameters' allgathers the last optimizer step left in flight (a
  /// no-op when none are, and without ZeRO). Every method here that reads or writes the
  /// parameters, but the training forward (which waits layer by layer), calls it first.
  void settle() {
    if constexpr (may_shard_state) std::visit([](auto& st) { st.dp->settle(); }, states_);
  }
  /// Stage I's blocks of the whole layout, at compile time.
  template <std::size_t I>
  static constexpr auto pieces_of = shards::stage<partition, I>;
  /// The world communicator, and this rank's pipeline group (ranked by stage).
  Comm& world_comm() { return world_; }
  Comm& pipeline_comm() { return pipe_; }
  /// Failure detection over the whole job (loom::trainer, fault_options): the world
  /// communicator's detector with deadline_s, shared by the pipeline group's and (hybrid) the
  /// data-parallel group's communicators, so that a dead or stopped stage anywhere makes every
  /// rank's wait end and one roll call over the world names it. Collective over the world.
  void watch_for_failures(double deadline_s)
    requires requires(Comm& c) { c.watch_as_part_of(c); }
  {
    world_.watch_for_failures(deadline_s);
    pipe_.watch_as_part_of(world_);
    if constexpr (hybrid) std::visit([&](auto& st) { st.dp->comm().watch_as_part_of(world_); }, states_);
  }
  void set_deadline(double deadline_s)
    requires requires(Comm& c) { c.watch_as_part_of(c); }
  {
    world_.set_deadline(deadline_s);
  }

  /// Whether a recovery can go on without lost ranks (hybrid over a communicator that recovers,
  /// loom::mpi_comm): whole replicas go on, and the ranks of a replica that lost one leave with
  /// it (loom::recover_world's group_size, the stage count). can_recover(): this run can (more
  /// than one replica). Not under ZeRO (shard_optimizer_state): a lost rank takes its slices of
  /// the optimizer state with it (the run ends; loomrun resumes it from the last checkpoint).
  static constexpr bool recoverable = hybrid && !may_shard_state && requires(Comm& c) {
    c.watch_as_part_of(c);
    c.replace_after_recovery(std::move(c));
  };
  bool can_recover() const noexcept { return recoverable && replicas_ > 1; }
  /// Ranks that hold one model replica together: the stages (1 without data parallelism, where
  /// nothing recovers).
  static constexpr int replica_ranks = hybrid ? static_cast<int>(stages) : 1;
  /// After a recovery replaced the world with whole replicas (a rank keeps its stage, r % S):
  /// splits it into pipeline and data-parallel groups again, watched as parts of it; forgets
  /// the gradient buckets in flight on the old groups; leaks the activation slots, whose
  /// abandoned sends and receives may still read or write them; moves the gradients to fresh
  /// memory. Collective over the new world.
  void after_recovery()
    requires recoverable
  {
    const int r = world_.rank(), s = static_cast<int>(stages);
    if (r % s != stage_)
      throw communication_error("loom::pipeline: internal error: after a recovery rank " + std::to_string(r) +
                                " would run stage " + std::to_string(r % s) + ", not its own " + std::to_string(stage_));
    replica_ = r / s;
    replicas_ = world_.size() / s;
    pipe_.replace_after_recovery(world_.split(replica_, r));
    pipe_.watch_as_part_of(world_);
    with_stage([&](auto& st, auto& m) {
      st.dp->comm().replace_after_recovery(world_.split(stage_, r));
      st.dp->comm().watch_as_part_of(world_);
      st.dp->after_recovery();
      static auto* abandoned = new std::vector<std::unique_ptr<typename std::remove_cvref_t<decltype(st)>::slot>>();
      for (auto& sl : st.slots) abandoned->push_back(std::move(sl));
      st.slots.clear();
      std::fill(st.slot_of.begin(), st.slot_of.end(), std::remove_cvref_t<decltype(st)>::none);
      m.renew_gradients();
    });
    held_bytes_ = 0;
    grads_written_ = false;
    figures_.replica = replica_;
  }
  /// The communicator over the replicas of this rank's stage (a recovery shares the stage's
  /// state over it).
  Comm& replica_comm()
    requires hybrid
  {
    return std::visit([](auto& st) -> Comm& { return st.dp->comm(); }, states_);
  }
  /// Whether each optimizer step can be committed over the world before it is taken
  /// (detail::step_commit, where the fit recovers): under failure detection, with several
  /// replicas.
  bool commits() const noexcept {
    if constexpr (recoverable) return world_.watch() != nullptr && replicas_ > 1;
    else return false;
  }

  /// The stage's model, its parameters complete (settle()). The const ones do not wait: fit
  /// settles before it returns, so only a fit in progress can have gathers in flight.
  models_type& models() {
    settle();
    return models_;
  }
  const models_type& models() const noexcept { return models_; }
  models_type& model() { return models(); }
  const models_type& model() const noexcept { return models_; }

  /// Calls f(state, model) with this rank's stage (state's type knows the stage at compile time).
  template <class F>
  decltype(auto) with_stage(F&& f) {
    return std::visit(
        [&](auto& st) -> decltype(auto) {
          constexpr std::size_t s = std::remove_cvref_t<decltype(st)>::index;
          return f(st, std::get<s>(models_));
        },
        states_);
  }

  /// This rank's flat parameters (the stage's), in the backend's memory, and their count.
  T* local_parameters() { return parameters(); }
  std::size_t local_count() const { return parameter_count(); }
  /// This rank's buffers (its stage's running statistics), in the backend's memory, and their count.
  T* local_buffers() {
    return std::visit([](auto& m) { return m.buffers().data(); }, models_);
  }
  std::size_t local_buffer_count() const { return partition::buffer_counts[static_cast<std::size_t>(stage_)]; }

  /// This stage's parameter count, and its flat parameter (complete: settle()) and gradient
  /// buffers. Under ZeRO the gradients are this rank's own after a step's backward (their sum
  /// over the replicas is only in its slices, shard_gradients()).
  std::size_t parameter_count() const { return partition::parameter_counts[static_cast<std::size_t>(stage_)]; }
  T* parameters() {
    settle();
    return std::visit([](auto& m) { return m.parameters().data(); }, models_);
  }
  T* gradients() {
    return std::visit([](auto& m) { return m.gradients().data(); }, models_);
  }

  /// See gradient_allreduce::check_same_job; over the whole world. Collective.
  void check_same_job(const std::string& description) {
    detail::check_same_job(world_, description, "loom::pipeline");
  }

  /// Pipelines have no split-invariant mode: deterministic_chunk must be 0.
  std::size_t prepare_fit(std::size_t, std::size_t deterministic_chunk) {
    if (deterministic_chunk != 0)
      throw invalid_argument("loom::trainer::fit: deterministic_chunk=" + std::to_string(deterministic_chunk) +
                             " needs loom::single_process or loom::data_parallel<Comm, ...>, not this policy "
                             "(tensor or pipeline parallelism): set deterministic_chunk = 0");
    return 0;
  }

  /// Under hybrid: every replica of this stage starts from replica 0's parameters. Collective.
  void broadcast_parameters() {
    settle();
    with_stage([&](auto& st, auto& m) {
      if constexpr (hybrid) st.dp->broadcast_parameters(m.parameters().data(), m.parameters().size());
    });
  }

  /// What one micro-step (one batch of the loader) brings to this stage: the samples on the
  /// first stage, the labels on the last.
  using batch_view = loom::batch_view<T>;

  /// Runs this stage's table on one batch: micro-step a of an accumulation group of `group`.
  /// Gradients are written (first backward of the group) or added to, scaled so that the sum
  /// over micro-batches, micro-steps and replicas is the mean over the optimizer step's
  /// samples. On the group's last micro-step, under hybrid, the data-parallel allreduce starts
  /// during the last backward and completes here. Returns the loss sums (last stage; zero
  /// elsewhere). Collective over the pipeline group (and the data-parallel group).
  loss_value micro_step(const batch_view& b, std::size_t a, std::size_t group, std::uint64_t seed, std::uint64_t step) {
    if (a == 0) grads_written_ = false;  // a new optimizer step: the first backward overwrites
    return with_stage([&](auto& st, auto& m) { return run_table(st, m, b, a, group, seed, step); });
  }

  /// Forward only (evaluation mode) of one batch through the pipeline: returns the loss sums
  /// on the last stage, zero elsewhere. Collective over the pipeline group.
  loss_value evaluate_batch(const batch_view& b, std::uint64_t seed, std::uint64_t step) {
    settle();
    return with_stage([&](auto& st, auto& m) { return run_evaluation(st, m, b, seed, step); });
  }

  /// Waits for this stage's sends still in flight (after the last evaluate_batch).
  void end_evaluation() {
    with_stage([&](auto& st, auto&) { complete_sends(st); });
  }

  /// Clips the gradient norm of the whole model to clip (0: no clipping; the squares summed
  /// over the stages, collective over the pipeline group). Under ZeRO it clips this rank's
  /// slices of the summed gradients (shard_gradients()), collective over the world.
  void clip_gradients(double clip) {
    if (clip <= 0) return;
    if constexpr (may_shard_state) {
      const double norm = std::sqrt(gradient_squared_norm());
      if (const std::size_t n = state_count()) scale_to_norm<Backend>(gshard_.data(), n, norm, clip);
    } else {
      scale_to_norm<Backend>(gradients(), parameter_count(), std::sqrt(gradient_squared_norm()), clip);
    }
  }

  /// The squared L2 norm of the gradients of the whole model (one replica), summed over the
  /// stages. Collective over the pipeline group; under ZeRO over the world: each rank's slice
  /// squares, which the replicas of a stage hold once between them.
  double gradient_squared_norm() {
    if constexpr (may_shard_state) {
      const std::size_t n = state_count();
      double sq = n ? Backend::sum(n, detail::squared_term<T>{gshard_.data()}) : 0.0;
      monitor::timed wait(figures_, &rank_figures::wait_s);
      world_.allreduce(&sq, 1, reduce_op::sum);
      return sq;
    } else {
      double sq = Backend::sum(parameter_count(), detail::squared_term<T>{gradients()});
      timed_allreduce(&sq, 1);
      return sq;
    }
  }

  /// ZeRO: this rank's slices of the stage's gradients summed over the replicas (state_count()
  /// values in the backend's memory, in the order of state_shard()'s pieces), complete after
  /// the last micro-step of a step.
  T* shard_gradients() noexcept
    requires may_shard_state
  {
    return gshard_.data();
  }

  /// ZeRO: clips the whole model's gradient norm to clip (0: none), steps this rank's slices
  /// with `state` (the slices' optimizer state) at learning rate lr, and starts the allgathers
  /// of every replica's stepped slices into the stage's parameters, which the next forward
  /// completes (see the class comment). Collective over the world (the norm, when clipping) and
  /// the stage's data-parallel group (the gathers).
  template <class State>
  void sharded_step(State& state, float lr, double clip)
    requires may_shard_state
  {
    clip_gradients(clip);
    with_stage([&](auto& st, auto& m) {
      const auto& z = st.dp->zero();
      T* params = m.parameters().data();  // complete: the forward settled them
      {
        monitor::timed compute(figures_, &rank_figures::compute_s);
        detail::step_zero_slices<Backend>(state, params, gshard_.data(), z, pshard_, lr);
      }
      // In flight until the next forward reaches each unit's layers (or settle()).
      st.dp->start_gather_parameters(params);
    });
  }

  /// The L2 norm of the whole model's parameters (one replica). Collective over the pipeline group.
  double parameters_l2() {
    double sq = Backend::sum(parameter_count(), detail::squared_term<T>{parameters()});
    pipe_.allreduce(&sq, 1, reduce_op::sum);
    return std::sqrt(sq);
  }

  /// The whole model's parameters in the whole network's flat layout, on every rank.
  /// Collective over the pipeline group.
  std::vector<T> gather_parameters() {
    settle();
    constexpr std::size_t width = [] {
      std::size_t w = 0;
      for (std::size_t c : partition::parameter_counts) w = c > w ? c : w;
      return w;
    }();
    std::vector<T> mine(width, T(0)), all(width * stages);
    stage_model_copy(mine.data());
    pipe_.allgather(mine.data(), all.data(), width);
    std::vector<T> out(Network::parameter_count);
    for (std::size_t s = 0; s < stages; ++s)
      std::copy_n(all.data() + s * width, partition::parameter_counts[s], out.data() + partition::parameter_offsets[s]);
    return out;
  }

  /// Sums the last stages' values over the whole world (losses and counts for reporting):
  /// the other stages' values do not count. Collective.
  void sum(double* values, std::size_t n) {
    if (!last_stage()) std::fill_n(values, n, 0.0);
    monitor::timed wait(figures_, &rank_figures::wait_s);
    world_.allreduce(values, n, reduce_op::sum);
  }

  rank_figures& figures() { return figures_; }
  /// Forward FLOPs per sample of this rank's stage.
  double flops_per_sample() const { return partition::flops[static_cast<std::size_t>(stage_)]; }
  /// Clears the figures (and the data-parallel engine's) for a new fit().
  void reset_figures() {
    figures_ = {};
    figures_.stage = stage_;
    figures_.replica = replica_;
    with_stage([](auto& st, auto&) {
      if constexpr (hybrid) st.dp->figures() = {};
    });
  }

  /// Every rank's figures on every rank, world rank order. Collective over the world.
  std::vector<rank_figures> gather_figures() {
    rank_figures f = figures_;
    f.peak_activation_bytes = static_cast<double>(peak_bytes_);
    f.parameter_bytes = static_cast<double>(parameter_count() * sizeof(T));
    with_stage([&](auto& st, auto&) {
      if constexpr (hybrid) {
        const rank_figures& d = st.dp->figures();
        f.comm_s += d.comm_s;
        f.comm_exposed_s += d.comm_exposed_s;
        f.bytes_sent += d.bytes_sent;
        f.comm_bytes += d.comm_bytes;
        f.bus_bytes += d.bus_bytes;
      }
    });
    return loom::gather_figures(world_, f);
  }

  /// Every rank's spans on world rank 0 (collective over the world).
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t, std::vector<std::size_t>& dropped) {
    return monitor::gather_timelines(world_, t, dropped);
  }

  /// The bytes of saved activations this rank's slots hold, the most it has needed at once
  /// since construction (see the class comment).
  std::size_t peak_activation_bytes() const noexcept { return peak_bytes_; }

 private:
  template <std::size_t... S>
  shard_map shard_of(std::index_sequence<S...>) const {
    shard_map m{.replica = replica_, .replicas = replicas_, .stage = stage_, .stages = static_cast<int>(stages),
                .whole_count = Network::parameter_count, .local_count = parameter_count(),
                .whole_buffer_count = Network::buffer_count,
                .local_buffer_count = partition::buffer_counts[static_cast<std::size_t>(stage_)]};
    ((S == static_cast<std::size_t>(stage_)
          ? (m.pieces = shards::stage<partition, S>, m.buffer_pieces = shards::stage_buffers<partition, S>, 0)
          : 0),
     ...);
    return m;
  }


  int checked_stage(Comm& world, const std::string& job) const {
    // The job first: ranks that disagree on the pipeline hear so before any of them splits.
    detail::check_same_job(world, "ranks=" + std::to_string(world.size()) + ";" + job + job_fields(), "loom::pipeline");
    const int n = world.size(), s = static_cast<int>(stages);
    if constexpr (hybrid) {
      if (n % s != 0)
        throw invalid_argument("loom::trainer with loom::hybrid<data_parallel, pipeline<" + std::to_string(stages) +
                               ">>: the world has " + std::to_string(n) + " ranks, expected a multiple of the " +
                               std::to_string(stages) + " stages (stages x replicas ranks)");
    } else {
      if (n != s)
        throw invalid_argument("loom::trainer with loom::model_parallel<pipeline<" + std::to_string(stages) +
                               ">>: the pipeline has " + std::to_string(stages) + " stages, one rank each, but the "
                               "communicator has " + std::to_string(n) + " ranks: start " + std::to_string(stages) +
                               " processes (mpirun -np " + std::to_string(stages) +
                               ") or use loom::hybrid<loom::data_parallel<...>, loom::pipeline<...>> for more");
    }
    return world.rank() % s;
  }

  /// ZeRO: the buffer of this rank's slices of the summed gradients, given to the stage's
  /// reduce-scatters, and the slices' blocks of the whole network's layout (state_shard()).
  void bind_shard()
    requires may_shard_state
  {
    with_stage([&](auto& st, auto&) {
      constexpr std::size_t s = std::remove_cvref_t<decltype(st)>::index;
      const auto& z = st.dp->zero();
      gshard_ = buffer<T, space>(std::max<std::size_t>(1, z.shard_count));
      st.dp->bind_shard(gshard_.data());
      state_pieces_.assign(z.pieces.begin(), z.pieces.end());  // the stage's layout -> the shard
      for (shard_piece& q : state_pieces_) q.whole_offset += partition::parameter_offsets[s];
    });
  }

  /// A training forward of micro-batch slot sl (n samples). Under ZeRO the step's first
  /// forward may find the parameters' gathers in flight: each layer first waits for its unit's
  /// (zero_layout::gather_unit), and the rest are completed after it.
  template <class State>
  activation<T, Backend> forward_awaiting_parameters(State& st, typename State::slot& sl, const run_context& ctx,
                                                     const T* params, std::size_t n) {
    if constexpr (may_shard_state) {
      if (st.dp->gathering()) {
        const auto y = sl.seq.forward(ctx, params, activation<const T, Backend>{sl.x}, n,
                                      [&](std::size_t layer) { st.dp->await_layer(layer); });
        st.dp->settle();  // a unit of layers the forward never reached (none in a chain)
        return y;
      }
    }
    return sl.seq.forward(ctx, params, activation<const T, Backend>{sl.x}, n);
  }

  states_type make_state_from_world() {
    std::optional<Comm> dp_comm;
    if constexpr (hybrid) dp_comm.emplace(world_.split(stage_, world_.rank()));
    return make_state(static_cast<std::size_t>(stage_), dp_comm, table_.micro_batches);
  }

  void stage_model_copy(T* dst) {
    std::visit([&](auto& m) { m.copy_to_host(m.parameters().data(), m.parameters().size(), dst); }, models_);
  }

  void timed_allreduce(double* v, std::size_t n) {
    monitor::timed wait(figures_, &rank_figures::wait_s);
    pipe_.allreduce(v, n, reduce_op::sum);
  }

  void wait_timed(request& r) {
    monitor::timed bubble(figures_, &rank_figures::bubble_s);
    r.wait();
  }
  void wait_all(std::vector<request>& rs) {
    if (rs.empty()) return;
    monitor::timed bubble(figures_, &rank_figures::bubble_s);
    for (auto& r : rs) r.wait();
    rs.clear();
  }

  static int tag_of(std::size_t m, pipeline_op_kind k) {
    const bool gradient = k == pipeline_op_kind::send_gradient || k == pipeline_op_kind::recv_gradient;
    return static_cast<int>(2 * m + (gradient ? 1 : 0));
  }
  int evaluation_tag() const { return static_cast<int>(2 * table_.micro_batches); }

  /// A free slot for micro-batch m of n samples: a free one (its pending sends completed
  /// first), or a new one when every slot holds a live micro-batch.
  template <class State>
  typename State::slot& acquire(State& st, std::size_t m, std::size_t n) {
    typename State::slot* s = nullptr;
    std::size_t index = 0;
    for (; index < st.slots.size(); ++index)
      if (!st.slots[index]->busy) {
        s = st.slots[index].get();
        break;
      }
    if (s == nullptr) {
      st.slots.push_back(std::make_unique<typename State::slot>(partition::bounds[State::index]));
      s = st.slots.back().get();
      // Its layers' buffers (running statistics) are the stage model's: every micro-batch's
      // forward in training moves them, as one after another.
      s->seq.bind_buffers(std::get<State::index>(models_).buffers().data());
    }
    wait_all(s->sends);
    s->busy = true;
    s->n = n;
    if (n > s->capacity) {
      if constexpr (!State::first) {
        s->input.reserve_discard(n * State::in_size);
        s->dx.reserve_discard(n * State::in_size);
      }
      s->dy.reserve_discard(n * State::out_size);
      held_bytes_ += (n - s->capacity) * State::saved_per_sample * sizeof(T);
      peak_bytes_ = std::max(peak_bytes_, held_bytes_);
      s->capacity = n;
    }
    if (m < table_.micro_batches) st.slot_of[m] = index;
    return *s;
  }
  template <class State>
  typename State::slot& slot_of(State& st, std::size_t m) {
    const std::size_t i = st.slot_of[m];
    if (i == State::none)
      throw invalid_argument("loom::pipeline: internal error: stage " + std::to_string(State::index) + " has no activations of micro-batch " +
                             std::to_string(m) + " (the schedule runs its backward before its forward)");
    return *st.slots[i];
  }
  template <class State>
  void release(State& st, std::size_t m) {
    st.slots[st.slot_of[m]]->busy = false;
    st.slot_of[m] = State::none;
  }
  template <class State>
  void complete_sends(State& st) {
    for (auto& s : st.slots) wait_all(s->sends);
  }

  /// A pointer for a message of n elements: p, or host memory when there is nothing to send
  /// (both ends of an empty message then name host memory, which every communicator moves).
  const T* message_data(const T* p, std::size_t n) const { return p && n > 0 ? p : &empty_; }
  T* message_data(T* p, std::size_t n) { return p && n > 0 ? p : &empty_; }

  template <class State, class Model>
  loss_value run_table(State& st, Model& model, const batch_view& b, std::size_t a, std::size_t group, std::uint64_t seed,
                       std::uint64_t step) {
    using enum pipeline_op_kind;
    constexpr std::size_t s = State::index;
    const std::size_t M = table_.micro_batches;
    const std::span<const pipeline_op> ops = table_.ops_of(s);
    std::size_t last_backward = 0;
    for (std::size_t k = 0; k < ops.size(); ++k)
      if (ops[k].kind == backward) last_backward = k;
    const bool last_of_group = a + 1 == group;
    const T scale = T(1) / static_cast<T>(b.global_n * group);
    T* params = model.parameters().data();
    T* grads = model.gradients().data();
    loss_value total;
    std::vector<request> receives;  // posted, not yet waited for
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const pipeline_op op = ops[i];
      const std::size_t m = op.micro_batch;
      const std::size_t lo = detail::micro_batch_begin(b.n, m, M), n = detail::micro_batch_begin(b.n, m + 1, M) - lo;
      const run_context ctx{.training = true, .accumulate = grads_written_, .seed = seed, .step = step,
                            .sample_offset = b.offset + lo, .math = math_};
      if (!is_communication(op.kind)) wait_all(receives);
      switch (op.kind) {
        case recv_activation: {
          auto& sl = acquire(st, m, n);
          sl.x = sl.input.data();
          const auto posted = monitor::clock::now();
          receives.push_back(pipe_.irecv(message_data(sl.input.data(), n), n * State::in_size, stage_ - 1, tag_of(m, op.kind)));
          monitor::record_span(monitor::span_kind::receive, posted, monitor::clock::now(), static_cast<std::int32_t>(m),
                               stage_ - 1, static_cast<double>(n * State::in_size * sizeof(T)));
          break;
        }
        case forward: {
          auto& sl = State::first ? acquire(st, m, n) : slot_of(st, m);
          if constexpr (State::first) sl.x = b.x + lo * State::in_size;
          sl.y = nullptr;
          if (n > 0) {
            // Under ZeRO this forward may wait for the parameters' gathers: exposed
            // communication (the data-parallel figures'), taken out of the compute time.
            double exposed_before = 0;
            if constexpr (may_shard_state) exposed_before = st.dp->figures().comm_exposed_s;
            monitor::timed compute(figures_, &rank_figures::compute_s);
            monitor::span fw(monitor::span_kind::forward, static_cast<std::int32_t>(m));
            const auto y = forward_awaiting_parameters(st, sl, ctx, params, n);
            sl.y_format = y.format;
            sl.y = sl.conv.template to_plain<T, typename State::out_shape>(y.data, y.format, n);
            if constexpr (State::last) {
              const loss_value v = Loss::template compute<Backend, State::out_size, T>(sl.y, b.labels + lo, sl.dy.data(), n,
                                                                                        scale, ws_);
              total.sum += v.sum;
              total.correct += v.correct;
            }
            fw.stop();
            compute.stop();
            if constexpr (may_shard_state) figures_.compute_s -= st.dp->figures().comm_exposed_s - exposed_before;
          } else {
            settle();  // no samples here: nothing reads the parameters, but they must be whole
          }
          break;
        }
        case send_activation: {
          auto& sl = slot_of(st, m);
          const auto posted = monitor::clock::now();
          sl.sends.push_back(pipe_.isend(message_data(sl.y, n), n * State::out_size, stage_ + 1, tag_of(m, op.kind)));
          figures_.bytes_sent += static_cast<double>(n * State::out_size * sizeof(T));
          monitor::record_span(monitor::span_kind::send, posted, monitor::clock::now(), static_cast<std::int32_t>(m),
                               stage_ + 1, static_cast<double>(n * State::out_size * sizeof(T)));
          break;
        }
        case recv_gradient: {
          auto& sl = slot_of(st, m);
          const auto posted = monitor::clock::now();
          receives.push_back(pipe_.irecv(message_data(sl.dy.data(), n), n * State::out_size, stage_ + 1, tag_of(m, op.kind)));
          monitor::record_span(monitor::span_kind::receive, posted, monitor::clock::now(), static_cast<std::int32_t>(m),
                               stage_ + 1, static_cast<double>(n * State::out_size * sizeof(T)));
          break;
        }
        case backward: {
          auto& sl = slot_of(st, m);
          if (n > 0) {
            monitor::timed compute(figures_, &rank_figures::compute_s);
            monitor::span bw(monitor::span_kind::backward, static_cast<std::int32_t>(m));
            const T* d = sl.dy.data();
            if (!sl.y_format.plain()) {
              sl.dy_layout.reserve_discard(n * State::out_size);
              sl.conv.template from_plain<T, typename State::out_shape>(sl.dy.data(), sl.y_format, sl.dy_layout.data(), n);
              d = sl.dy_layout.data();
            }
            T* dx = State::first ? nullptr : sl.dx.data();
            if (hybrid && last_of_group && i == last_backward) {
              sl.seq.backward(ctx, params, activation<const T, Backend>{sl.x}, d, dx, grads, [&](std::size_t layer) {
                if constexpr (hybrid) st.dp->layer_done(layer, grads);
              });
            } else {
              sl.seq.backward(ctx, params, activation<const T, Backend>{sl.x}, d, dx, grads);
            }
            grads_written_ = true;
            bw.stop();
            compute.stop();
          }
          if constexpr (State::first) release(st, m);
          break;
        }
        case send_gradient: {
          auto& sl = slot_of(st, m);
          const auto posted = monitor::clock::now();
          sl.sends.push_back(pipe_.isend(message_data(sl.dx.data(), n), n * State::in_size, stage_ - 1,
                                         tag_of(m, op.kind)));
          figures_.bytes_sent += static_cast<double>(n * State::in_size * sizeof(T));
          monitor::record_span(monitor::span_kind::send, posted, monitor::clock::now(), static_cast<std::int32_t>(m),
                               stage_ - 1, static_cast<double>(n * State::in_size * sizeof(T)));
          release(st, m);
          break;
        }
      }
      if (!op.posted_with_next) wait_all(receives);
    }
    wait_all(receives);
    complete_sends(st);
    if (last_of_group) {
      monitor::timed compute(figures_, &rank_figures::compute_s);
      if (!grads_written_) {  // no sample of this step reached this stage: contribute zeros
        Backend::zero(grads, model.parameters().size());
        grads_written_ = true;
      }
      compute.stop();
      if constexpr (hybrid) st.dp->finish(grads);
    }
    return total;
  }

  template <class State, class Model>
  loss_value run_evaluation(State& st, Model& model, const batch_view& b, std::uint64_t seed, std::uint64_t step) {
    const run_context ctx{.training = false, .accumulate = false, .seed = seed, .step = step, .sample_offset = b.offset,
                          .math = math_};
    auto& sl = acquire(st, table_.micro_batches, b.n);
    loss_value v;
    if constexpr (State::first) {
      sl.x = b.x;
    } else {
      sl.x = sl.input.data();
      auto r = pipe_.irecv(message_data(sl.input.data(), b.n), b.n * State::in_size, stage_ - 1, evaluation_tag());
      wait_timed(r);
    }
    sl.y = nullptr;
    if (b.n > 0) {
      monitor::timed compute(figures_, &rank_figures::compute_s);
      const auto y = sl.seq.forward(ctx, model.parameters().data(), activation<const T, Backend>{sl.x}, b.n);
      sl.y = sl.conv.template to_plain<T, typename State::out_shape>(y.data, y.format, b.n);
      if constexpr (State::last)
        v = Loss::template compute<Backend, State::out_size, T>(sl.y, b.labels, nullptr, b.n, T(1), ws_);
      compute.stop();
    }
    if constexpr (!State::last)
      sl.sends.push_back(pipe_.isend(message_data(sl.y, b.n), b.n * State::out_size, stage_ + 1, evaluation_tag()));
    sl.busy = false;  // its send completes before the slot is used again
    return v;
  }

  detail::pipeline_run_table table_;
  Comm world_;
  int stage_;
  math_mode math_;
  int replica_, replicas_;
  Comm pipe_;
  models_type models_;
  states_type states_;
  loss_workspace<Backend> ws_;
  rank_figures figures_;
  bool grads_written_ = false;
  std::size_t held_bytes_ = 0, peak_bytes_ = 0;
  T empty_{};
  // ZeRO (shard_optimizer_state): this rank's slices of the summed gradients, of the
  // parameters for an optimizer that cannot step them where they lie (steps_in_place), and
  // the slices' blocks of the whole layout (state_shard()).
  buffer<T, space> gshard_, pshard_;
  std::vector<shard_piece> state_pieces_;
};

/// Runs one rank's stage of Network cut by Pipeline (a loom::pipeline<S, ...>) with Loss and
/// Optimizer on Backend, over communicator Comm; DataParallel is a loom::data_parallel<Comm, ...>
/// under loom::hybrid (detail::no_data_parallel otherwise). Satisfies loom::engine: the stage
/// (pipeline_stages) and its optimizer state.
template <class Network, class Loss, class Optimizer, class Backend, class Pipeline, class Comm,
          class DataParallel = detail::no_data_parallel>
class pipeline_engine
    : public pipeline_stages<Network, Loss, Backend, typename detail::stage_cut_of<Pipeline>::type, Comm, DataParallel> {
  using base = pipeline_stages<Network, Loss, Backend, typename detail::stage_cut_of<Pipeline>::type, Comm, DataParallel>;

 public:
  using typename base::T;
  using partition = stage_partition<Network, Pipeline>;
  using schedule = typename Pipeline::schedule;
  static constexpr std::size_t micro_batch_count = Pipeline::micro_batch_count;
  using optimizer_state = typename Optimizer::template state<T, Backend>;
  using optimizer_options = typename Optimizer::options;

  /// See pipeline_stages' constructor; also the stage's optimizer state, from setup.optimizer.
  pipeline_engine(Comm world, const engine_setup<optimizer_options>& setup)
      : pipeline_engine(std::move(world), setup, detail::pipeline_run_table::of<Pipeline>()) {}
  /// The same, running the schedule `table` (detail::pipeline_run_table::of<P>() of a pipeline
  /// P cut as Pipeline is: the trainer shares one engine type between the micro-batch counts
  /// and schedules of one cut). micro_batch_count and schedule above are then Pipeline's, not
  /// the table's.
  pipeline_engine(Comm world, const engine_setup<optimizer_options>& setup, detail::pipeline_run_table table)
      : base(std::move(world), setup.seed, setup.math, setup.job, std::move(table)),
        state_(setup.optimizer, base::state_count()) {}

  optimizer_state& optimizer() noexcept { return state_; }

  /// Clips the gradient norm of the whole model and steps this stage's optimizer on its own
  /// buffers (under ZeRO on this rank's slices: pipeline_stages::sharded_step).
  void optimizer_step(float lr, double clip) {
    monitor::span span(monitor::span_kind::optimizer);
    if constexpr (base::may_shard_state) {
      base::sharded_step(state_, lr, clip);
    } else {
      base::clip_gradients(clip);
      if (commit_.enabled() && base::commits()) commit_.commit(base::world_comm(), lr);  // the step's last collective
      take_step(lr);
    }
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

  /// See pipeline_stages::after_recovery; a commit in flight is given up (the step is redone,
  /// or was finished by finish_committed_step).
  void after_recovery()
    requires base::recoverable
  {
    commit_.taken();
    base::after_recovery();
  }

 private:
  void take_step(float lr) {
    monitor::timed compute(base::figures(), &rank_figures::compute_s);
    state_.step(base::parameters(), base::gradients(), base::parameter_count(), lr);
    commit_.taken();
  }

  optimizer_state state_;
  detail::step_commit commit_;
};

}  // namespace loom
