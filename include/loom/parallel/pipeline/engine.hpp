// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::pipeline_engine: the run-time half of pipeline model parallelism, and the engine
// (loom/parallel/engine.hpp) the trainer drives for pipelines. One rank runs one stage: it
// holds only that stage's model (parameters and gradients) and optimizer state, and executes
// the stage's schedule table (loom/parallel/pipeline/schedule.hpp) each step
// (detail::stage_runner, loom/parallel/pipeline/stage.hpp). Under loom::hybrid it also averages
// its stage's gradients over the replicas with a gradient_allreduce. The fit loop around it is
// loom::trainer (loom/train/trainer.hpp); no communicator is included here.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/optim/clip.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/parallel/pipeline/stage.hpp"
#include "loom/parallel/shard_map.hpp"
#include "loom/parallel/with_optimizer.hpp"
#include "loom/parallel/data/zero_shard.hpp"

namespace loom {

/// Runs one rank's stage of Network cut by Pipeline (a loom::pipeline<S, ...>) with Loss on
/// Backend, over communicator Comm; DataParallel is a loom::data_parallel<Comm, ...> under
/// loom::hybrid (detail::no_data_parallel otherwise): everything of pipeline_engine but the
/// optimizer (detail::with_optimizer). Pipeline decides only the stages (pipeline_engine passes
/// detail::stage_cut_of: the stage count and cut points); the micro-batch count and the
/// schedule's tables come at run time (detail::pipeline_run_table). How a stage runs — ranks,
/// memory, messages, GPUs, ZeRO — is docs/model-parallel.md, "How a stage runs".
template <class Network, class Loss, class Backend, class Pipeline, class Comm,
          class DataParallel = detail::no_data_parallel>
class pipeline_stages : public detail::stage_runner<Network, Loss, Backend, Pipeline, Comm, DataParallel> {
  using runner = detail::stage_runner<Network, Loss, Backend, Pipeline, Comm, DataParallel>;
  static_assert(is_pipeline_v<Pipeline>, "loom::pipeline_engine: Pipeline must be a loom::pipeline<Stages, ...>");
  static_assert(communicator<Comm>,
                "loom::pipeline_engine: Comm must be a loom communicator (loom::mpi_comm, loom::local_comm, "
                "loom::nccl_comm)");
  static_assert(detail::comm_reaches_memory_of<Comm, Backend>(),
                "loom::pipeline_engine: pipeline stages exchange activations in GPU memory, which this "
                "communicator cannot move (mpi_comm and local_comm take host memory): with loom::cuda use "
                "loom::nccl_comm from <loom/comm/nccl.hpp>, or train on loom::cpu");
  using runner::grid_;
  using runner::stage_;
  using runner::pipe_;
  using runner::models_;
  using runner::states_;
  using runner::figures_;
  using runner::grads_written_;

 public:
  using typename runner::T;
  using typename runner::value_type;
  using typename runner::partition;
  using typename runner::models_type;
  using typename runner::batch_view;
  using runner::stages;
  using runner::hybrid;
  using runner::may_shard_state;

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
      : runner(std::move(world), seed, math, job, std::move(table)) {
    figures_.stage = stage_;
    figures_.replica = replica();
    broadcast_parameters();
    if constexpr (may_shard_state) bind_shard();
  }

  /// Only one rank of the pipeline holds the loss: the last stage's.
  static constexpr bool every_rank_holds_loss = false;

  int rank() const { return grid_.rank(); }
  int world() const { return grid_.size(); }
  int stage() const { return stage_; }
  int replica() const { return grid_.replica(); }
  int replicas() const { return grid_.replicas(); }
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
    if constexpr (may_shard_state) return zero_.state_map(shard());
    else return shard();
  }
  /// Values per buffer of the optimizer state: the stage's parameters, or under ZeRO the
  /// values of this rank's slices.
  std::size_t state_count() const {
    if constexpr (may_shard_state) return zero_.count();
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
  Comm& world_comm() { return grid_.world(); }
  Comm& pipeline_comm() { return pipe_; }
  /// Failure detection over the whole job (loom::trainer, fault_options): the world
  /// communicator's detector with deadline_s, shared by the pipeline group's and (hybrid) the
  /// data-parallel group's communicators (detail::rank_grid). Collective over the world.
  void watch_for_failures(double deadline_s)
    requires detail::part_watching_communicator<Comm>
  {
    grid_.watch_for_failures(deadline_s, pipe_, data_comm());
  }
  void set_deadline(double deadline_s)
    requires detail::part_watching_communicator<Comm>
  {
    grid_.set_deadline(deadline_s);
  }

  /// Whether a recovery can go on without lost ranks (hybrid over a communicator that recovers,
  /// loom::mpi_comm): whole replicas go on, and the ranks of a replica that lost one leave with
  /// it (loom::recover_world's group_size, the stage count). can_recover(): this run can (more
  /// than one replica). Not under ZeRO (shard_optimizer_state): a lost rank takes its slices of
  /// the optimizer state with it (the run ends; loomrun resumes it from the last checkpoint).
  static constexpr bool recoverable = hybrid && !may_shard_state && detail::regrouping_communicator<Comm>;
  bool can_recover() const noexcept { return recoverable && replicas() > 1; }
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
    grid_.after_recovery(pipe_, data_comm());
    this->with_stage([&](auto& st, auto& m) {
      st.dp->after_recovery();
      st.slots.abandon();
      m.renew_gradients();
    });
    grads_written_ = false;
    figures_.replica = replica();
  }
  /// The stage's parameters and the optimizer buffers `buffers` of its replica 0 to its other
  /// replicas (the recovery has brought them all to the same step). Collective over the world.
  void broadcast_state(std::span<T> buffers, int /*root*/)
    requires recoverable
  {
    Comm& replicas = replica_comm();
    replicas.broadcast(parameters(), parameter_count(), 0);
    replicas.broadcast(buffers.data(), buffers.size(), 0);
    if (local_buffer_count()) replicas.broadcast(local_buffers(), local_buffer_count(), 0);
  }
  /// The communicator over the replicas of this rank's stage (a recovery shares the stage's
  /// state over it).
  Comm& replica_comm()
    requires hybrid
  {
    return std::visit([](auto& st) -> Comm& { return st.dp->comm(); }, states_);
  }
  /// Whether each optimizer step is committed over the world before it is taken
  /// (detail::step_commit, where the fit recovers): under failure detection, with several
  /// replicas.
  static constexpr bool commits_steps = recoverable;
  bool commits() const noexcept {
    if constexpr (recoverable) return grid_.commits();
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

  /// This rank's flat parameters (the stage's), in the backend's memory, and their count.
  T* local_parameters() { return parameters(); }
  T* local_gradients() { return gradients(); }
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
    detail::check_same_job(grid_.world(), description, "loom::pipeline");
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
    this->with_stage([&](auto& st, auto& m) {
      if constexpr (hybrid) st.dp->broadcast_parameters(m.parameters().data(), m.parameters().size());
    });
  }

  /// Runs this stage's table on one batch (detail::stage_runner::run_table): micro-step a of an
  /// accumulation group of `group`. Collective over the pipeline group (and the data-parallel
  /// group).
  loss_value micro_step(const batch_view& b, std::size_t a, std::size_t group, std::uint64_t seed, std::uint64_t step) {
    if (a == 0) grads_written_ = false;  // a new optimizer step: the first backward overwrites
    return this->with_stage([&](auto& st, auto& m) { return this->run_table(st, m, b, a, group, seed, step); });
  }

  /// Forward only (evaluation mode) of one batch through the pipeline: returns the loss sums
  /// on the last stage, zero elsewhere. Collective over the pipeline group.
  loss_value evaluate_batch(const batch_view& b, std::uint64_t seed, std::uint64_t step) {
    settle();
    return this->with_stage([&](auto& st, auto& m) { return this->run_evaluation(st, m, b, seed, step); });
  }

  /// Waits for this stage's sends still in flight (after the last evaluate_batch).
  void end_evaluation() {
    this->with_stage([&](auto& st, auto&) { this->complete_sends(st); });
  }

  /// Clips the gradient norm of the whole model to clip (0: no clipping; the squares summed
  /// over the stages, collective over the pipeline group).
  void clip_and_close_step(double clip) {
    if (clip > 0) scale_to_norm<Backend>(gradients(), parameter_count(), std::sqrt(gradient_squared_norm()), clip);
  }

  /// The squared L2 norm of the gradients of the whole model (one replica), summed over the
  /// stages. Collective over the pipeline group; under ZeRO over the world: each rank's slice
  /// squares, which the replicas of a stage hold once between them.
  double gradient_squared_norm() {
    if constexpr (may_shard_state) {
      double sq = zero_.squares();
      monitor::timed wait(figures_, &rank_figures::wait_s);
      grid_.world().allreduce(&sq, 1, reduce_op::sum);
      return sq;
    } else {
      double sq = Backend::sum(parameter_count(), detail::squared_term<T>{gradients()});
      monitor::timed wait(figures_, &rank_figures::wait_s);
      pipe_.allreduce(&sq, 1, reduce_op::sum);
      return sq;
    }
  }

  /// ZeRO: this rank's slices of the stage's gradients summed over the replicas (state_count()
  /// values in the backend's memory, in the order of state_shard()'s pieces), complete after
  /// the last micro-step of a step.
  T* shard_gradients() noexcept
    requires may_shard_state
  {
    return zero_.gradients();
  }

  /// ZeRO: clips the whole model's gradient norm to clip (0: none), steps this rank's slices
  /// with `state` (the slices' optimizer state) at learning rate lr, and starts the allgathers
  /// of every replica's stepped slices into the stage's parameters, which the next forward
  /// completes. Collective over the world (the norm, when clipping) and the stage's
  /// data-parallel group (the gathers).
  template <class State>
  void sharded_step(State& state, float lr, double clip)
    requires may_shard_state
  {
    if (clip > 0) zero_.clip_to(std::sqrt(gradient_squared_norm()), clip);
    this->with_stage([&](auto& st, auto& m) {
      T* params = m.parameters().data();  // complete: the forward settled them
      {
        monitor::timed compute(figures_, &rank_figures::compute_s);
        zero_.step(state, params, *st.dp, lr);
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
    std::visit([&](auto& m) { m.copy_to_host(m.parameters().data(), m.parameters().size(), mine.data()); }, models_);
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
    grid_.world().allreduce(values, n, reduce_op::sum);
  }

  rank_figures& figures() { return figures_; }
  /// Forward FLOPs per sample of this rank's stage.
  double flops_per_sample() const { return partition::flops[static_cast<std::size_t>(stage_)]; }
  /// Clears the figures (and the data-parallel engine's) for a new fit().
  void reset_figures() {
    figures_ = {};
    figures_.stage = stage_;
    figures_.replica = replica();
    this->with_stage([](auto& st, auto&) {
      if constexpr (hybrid) st.dp->figures() = {};
    });
  }

  /// Every rank's figures on every rank, world rank order. Collective over the world.
  std::vector<rank_figures> gather_figures() {
    rank_figures f = figures_;
    f.peak_activation_bytes = static_cast<double>(peak_activation_bytes());
    f.parameter_bytes = static_cast<double>(parameter_count() * sizeof(T));
    this->with_stage([&](auto& st, auto&) {
      if constexpr (hybrid) {
        const rank_figures& d = st.dp->figures();
        f.comm_s += d.comm_s;
        f.comm_exposed_s += d.comm_exposed_s;
        f.bytes_sent += d.bytes_sent;
        f.comm_bytes += d.comm_bytes;
        f.bus_bytes += d.bus_bytes;
      }
    });
    return loom::gather_figures(grid_.world(), f);
  }

  /// Every rank's spans on world rank 0 (collective over the world).
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t, std::vector<std::size_t>& dropped) {
    return monitor::gather_timelines(grid_.world(), t, dropped);
  }

  /// The bytes of saved activations this rank's slots hold, the most it has needed at once
  /// since construction (see docs/model-parallel.md, "How a stage runs").
  std::size_t peak_activation_bytes() const noexcept {
    return std::visit([](const auto& st) { return st.slots.peak_bytes(); }, states_);
  }

 private:
  template <std::size_t... S>
  shard_map shard_of(std::index_sequence<S...>) const {
    shard_map m{.replica = replica(), .replicas = replicas(), .stage = stage_, .stages = static_cast<int>(stages),
                .whole_count = Network::parameter_count, .local_count = parameter_count(),
                .whole_buffer_count = Network::buffer_count,
                .local_buffer_count = partition::buffer_counts[static_cast<std::size_t>(stage_)]};
    ((S == static_cast<std::size_t>(stage_)
          ? (m.pieces = shards::stage<partition, S>, m.buffer_pieces = shards::stage_buffers<partition, S>, 0)
          : 0),
     ...);
    return m;
  }
  /// The data-parallel group's communicator (hybrid), else null.
  Comm* data_comm() {
    if constexpr (hybrid) return &replica_comm();
    else return nullptr;
  }

  /// ZeRO: the buffer of this rank's slices of the summed gradients, given to the stage's
  /// reduce-scatters, and the slices' blocks of the whole network's layout (state_shard()).
  void bind_shard()
    requires may_shard_state
  {
    this->with_stage([&](auto& st, auto&) {
      constexpr std::size_t s = std::remove_cvref_t<decltype(st)>::index;
      zero_.bind(*st.dp);
      zero_.set_pieces(st.dp->zero().pieces, partition::parameter_offsets[s]);  // the stage's layout -> the whole
    });
  }

  // ZeRO (shard_optimizer_state): this rank's slices of the summed gradients and their blocks.
  detail::zero_shard<T, Backend> zero_;
};

/// Runs one rank's stage of Network cut by Pipeline (a loom::pipeline<S, ...>) with Loss and
/// Optimizer on Backend, over communicator Comm; DataParallel is a loom::data_parallel<Comm, ...>
/// under loom::hybrid (detail::no_data_parallel otherwise). Satisfies loom::engine: the stage
/// (pipeline_stages) and its optimizer state (detail::with_optimizer).
template <class Network, class Loss, class Optimizer, class Backend, class Pipeline, class Comm,
          class DataParallel = detail::no_data_parallel>
class pipeline_engine
    : public detail::with_optimizer<
          pipeline_stages<Network, Loss, Backend, typename detail::stage_cut_of<Pipeline>::type, Comm, DataParallel>,
          Optimizer> {
  using base = detail::with_optimizer<
      pipeline_stages<Network, Loss, Backend, typename detail::stage_cut_of<Pipeline>::type, Comm, DataParallel>, Optimizer>;

 public:
  using partition = stage_partition<Network, Pipeline>;
  using schedule = typename Pipeline::schedule;
  static constexpr std::size_t micro_batch_count = Pipeline::micro_batch_count;
  using optimizer_options = typename Optimizer::options;

  /// See pipeline_stages' constructor; also the stage's optimizer state, from setup.optimizer.
  pipeline_engine(Comm world, const engine_setup<optimizer_options>& setup)
      : pipeline_engine(std::move(world), setup, detail::pipeline_run_table::of<Pipeline>()) {}
  /// The same, running the schedule `table` (detail::pipeline_run_table::of<P>() of a pipeline
  /// P cut as Pipeline is: the trainer shares one engine type between the micro-batch counts
  /// and schedules of one cut). micro_batch_count and schedule above are then Pipeline's, not
  /// the table's.
  pipeline_engine(Comm world, const engine_setup<optimizer_options>& setup, detail::pipeline_run_table table)
      : base(setup.optimizer, std::move(world), setup.seed, setup.math, setup.job, std::move(table)) {
    this->ws_.label_smoothing = setup.label_smoothing;  // the last stage's loss
  }
};

}  // namespace loom
