// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::replica_engine: the engine (loom/parallel/engine.hpp) of every policy in which a rank
// holds one model it runs whole — the whole network (single_process, data_parallel) or its
// tensor-parallel slice (model_parallel<tensor_parallel<T>>, hybrid<data_parallel, tensor_parallel>).
// It owns the model and the optimizer state, runs the passes and the loss, clips and steps; the
// policy's communication is its Sync (single_process_sync, gradient_allreduce,
// tensor_parallel_sync). Also the split-invariant mode (deterministic_chunk) of single_process and
// data_parallel. Pipelines have their own engine (loom/parallel/pipeline/engine.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/backend/kernels/optim.hpp"
#include "loom/core/error.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/process_group.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/clip.hpp"
#include "loom/parallel/data/chunk_tree.hpp"
#include "loom/parallel/data/chunked_steps.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/parallel/shard_map.hpp"
#include "loom/parallel/with_optimizer.hpp"
#include "loom/parallel/data/zero_shard.hpp"

namespace loom {

namespace detail {
/// Whether Sync runs tensor-parallel layers (its model is a slice and needs its group).
template <class Sync>
concept tensor_sync = requires(Sync& s) {
  s.group();
  s.model_shard();
};
/// Whether Sync averages gradients over replicas with a communicator (data_parallel).
template <class Sync>
concept replica_comm_sync = requires(Sync& s) { s.comm(); } && !tensor_sync<Sync>;

/// The communicator over this rank's data-parallel replicas: data_parallel's, or a hybrid
/// tensor slice's replicas; void where there are none (single_process, tensor parallelism alone).
template <class Sync>
struct replica_comm_of {
  using type = void;
};
template <replica_comm_sync Sync>
struct replica_comm_of<Sync> {
  using type = std::remove_reference_t<decltype(std::declval<Sync&>().comm())>;
};
template <tensor_sync Sync>
  requires requires(Sync& s) { s.replica_comm(); }
struct replica_comm_of<Sync> {
  using type = std::remove_reference_t<decltype(std::declval<Sync&>().replica_comm())>;
};

/// The data-parallel replicas as the layers' process group (synchronized batch norm,
/// loom::sync_batch_norm): a batch norm's sums go over the communicator the gradients are
/// averaged over — bound before each training pass, so that it is the communicator a recovery
/// rebuilt — and their time counts as waiting in collectives (rank_figures::wait_s).
template <class Comm>
class replica_sums final : public process_group {
 public:
  void bind(Comm* comm, rank_figures* figures) noexcept {
    comm_ = comm;
    figures_ = figures;
  }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void allreduce_sum(float* data, std::size_t n) override { sum(data, n); }
  void allreduce_sum(double* data, std::size_t n) override { sum(data, n); }

 private:
  template <class V>
  void sum(V* data, std::size_t n) {
    monitor::timed t(*figures_, &rank_figures::wait_s);
    comm_->allreduce(data, n, reduce_op::sum);
  }
  Comm* comm_ = nullptr;
  rank_figures* figures_ = nullptr;
};
}  // namespace detail

/// Runs one rank of Network's training with Loss on Backend; Sync (see above) communicates.
/// Everything of replica_engine but the optimizer (detail::with_optimizer), so that trainers of
/// one network and policy with different optimizers share its code.
template <class Network, class Loss, class Backend, class Sync>
class replica_passes {
 public:
  using value_type = float;
  using T = value_type;
  using backend_type = Backend;
  /// The network this rank runs: Network, or its tensor-parallel slice.
  using rank_network = typename Sync::rank_network;
  using model_type = ::loom::model<rank_network, T, Backend>;
  using sync_type = Sync;
  /// The blocks of the whole layout that slice I holds (I = 0 unless tensor parallel), at
  /// compile time (see loom::shards).
  template <std::size_t I>
  static constexpr auto pieces_of = Sync::template pieces_of<I>;
  static constexpr bool tensor_split = detail::tensor_sync<Sync>;
  static_assert(rank_network::buffer_count == Network::buffer_count,
                "loom: a tensor-parallel slice holds the whole network's buffers (its batch norms are whole)");
  static_assert(!detail::compresses_v<Sync> || Backend::memory_space::host_accessible,
                "loom::compress<>: compressed gradients are converted in host memory; this backend's gradients are "
                "not (loom::cuda): drop compress<> for now");
  static constexpr bool deterministic_capable = !tensor_split;
  /// ZeRO stage 1 (loom::shard_optimizer_state): whether the optimizer state may hold this
  /// rank's slices only (Sync's policy says so, or chooses at run time), and whether it does.
  static constexpr bool may_shard_state = detail::may_shard_state_v<Sync>;
  bool shards_state() const noexcept {
    if constexpr (may_shard_state) return sync_.sharding();
    else return false;
  }
  /// Every rank that holds samples holds their loss (the whole model, or a tensor slice whose
  /// group computes it alike).
  static constexpr bool every_rank_holds_loss = true;

  /// Takes the communication `sync`, checks that every rank runs `job` (collective), then that
  /// Backend runs `math`, initialises the model from `seed`, and makes every replica start from
  /// replica 0's parameters. Throws loom::invalid_argument when Backend cannot run math;
  /// loom::communication_error when the ranks' jobs differ.
  replica_passes(Sync sync, std::uint64_t seed, math_mode math, const std::string& job, bool sync_batch_norm = false)
      : sync_(std::move(sync)),
        // The job first, on every rank alike: ranks asking for different math modes hear of
        // the difference rather than one of them stopping alone.
        // (Not in a replacement of a lost rank, which the survivors do not run with: its
        // first fit checks the job and takes their parameters; fault_options::replace.)
        math_((detail::fault_state.joining_as_replacement ? void() : sync_.check_same_job(job), detail::checked_math<Backend>(math))),
        model_(seed, 0, model_shard(sync_)),
        sync_batch_norm_(sync_batch_norm) {
    if (!detail::fault_state.joining_as_replacement) sync_.broadcast_parameters(model_.parameters().data(), model_type::parameter_count);
    if constexpr (may_shard_state)
      if (shards_state()) bind_shard();
  }

  int rank() const { return sync_.rank(); }
  int world() const { return sync_.world(); }
  int replica() const { return sync_.replica(); }
  int replicas() const { return sync_.replicas(); }
  bool reads_samples() const { return true; }
  bool reads_labels() const { return true; }
  /// What this rank holds: the policy's blocks of the parameters, and the whole network's
  /// buffers (running statistics: each replica its own; every tensor slice a whole copy).
  shard_map shard() const {
    shard_map m = sync_.shard();
    m.whole_buffer_count = Network::buffer_count;
    m.local_buffer_count = rank_network::buffer_count;
    m.buffer_pieces = shards::whole_buffers<Network, tensor_split>;
    return m;
  }
  /// What this rank holds of the optimizer state: the same as shard(), or under
  /// shard_optimizer_state its slices (one block per bucket, in its own flat layout), every
  /// rank as replica 0 of 1 (together they hold the one copy).
  shard_map state_shard() const {
    if constexpr (may_shard_state)
      if (shards_state()) return zero_.state_map(sync_.shard());
    return sync_.shard();
  }
  /// Values per buffer of the optimizer state (local_count(), or the shard's under ZeRO).
  std::size_t state_count() const noexcept {
    if constexpr (may_shard_state)
      if (shards_state()) return zero_.count();
    return model_type::parameter_count;
  }

  /// The model, its parameters complete (settle()). The const one does not wait: fit settles
  /// before it returns, so only a fit in progress can have gathers in flight.
  model_type& model() {
    settle();
    return model_;
  }
  const model_type& model() const noexcept { return model_; }
  /// ZeRO (shard_optimizer_state): the optimizer step leaves the parameters' allgathers in
  /// flight, and the next forward waits for each gather unit as it reaches its layers, so that
  /// the gather overlaps the forward. settle() waits for whatever is still in flight; every method
  /// here that reads or writes the parameters other than micro_step's forward calls it first.
  /// Collective only in the sense that every rank started the same gathers; a no-op otherwise.
  void settle() {
    if constexpr (may_shard_state) sync_.settle();
  }
  Sync& sync() noexcept { return sync_; }
  /// The communicator over every rank (loom::comm_collectives wraps it); none training alone.
  decltype(auto) world_comm()
    requires requires(Sync& s) { s.world_comm(); }
  {
    return sync_.world_comm();
  }
  /// Failure detection with deadline_s over every communicator of this engine (loom::trainer,
  /// fault_options); set_deadline changes the deadline. Collective over the world.
  void watch_for_failures(double deadline_s)
    requires requires(Sync& s) { s.world_comm().watch_for_failures(deadline_s); }
  {
    if constexpr (requires { sync_.watch_for_failures(deadline_s); }) sync_.watch_for_failures(deadline_s);
    else sync_.world_comm().watch_for_failures(deadline_s);
  }
  void set_deadline(double deadline_s)
    requires requires(Sync& s) { s.world_comm().set_deadline(deadline_s); }
  {
    if constexpr (requires { sync_.set_deadline(deadline_s); }) sync_.set_deadline(deadline_s);
    else sync_.world_comm().set_deadline(deadline_s);
  }
  /// This rank's flat parameters (the whole model's or its slice's), in the backend's memory,
  /// and their count.
  T* local_parameters() {
    settle();
    return model_.parameters().data();
  }
  T* local_gradients() noexcept { return model_.gradients().data(); }
  std::size_t local_count() const noexcept { return model_type::parameter_count; }
  /// This rank's buffers (running statistics), in the backend's memory, and their count.
  T* local_buffers() { return model_.buffers().data(); }
  std::size_t local_buffer_count() const noexcept { return model_type::buffer_count; }
  /// The communicator of data_parallel (for programs that also communicate themselves).
  decltype(auto) comm()
    requires detail::replica_comm_sync<Sync>
  {
    return sync_.comm();
  }

  void check_same_job(const std::string& description) { sync_.check_same_job(description); }

  /// Whether this engine's communication can continue on the survivors of a failed rank
  /// (data parallelism; see loom::trainer's recovery).
  /// Not under shard_optimizer_state: a lost rank takes its slice of the optimizer state with
  /// it (the run ends; loomrun resumes it from the last checkpoint). `recoverable` says whether
  /// the code can; can_recover() whether this run can (not where it shards the state).
  /// A hybrid with tensor parallelism recovers on its data-parallel axis: the replicas that
  /// lost a rank leave whole (replica_ranks ranks each), the others go on; with one replica
  /// left there is nothing to go on with.
  static constexpr bool recoverable = [] {
    if constexpr (detail::tensor_sync<Sync>) return Sync::recoverable;
    else return detail::replica_comm_sync<Sync> && !detail::shards_state_v<Sync>;
  }();
  bool can_recover() const noexcept { return recoverable && !shards_state() && (!tensor_split || replicas() > 1); }
  /// The communicator over the replicas of this rank's slice (a hybrid's recovery shares the
  /// slice's state over it).
  decltype(auto) replica_comm()
    requires requires(Sync& s) { s.replica_comm(); }
  {
    return sync_.replica_comm();
  }
  /// Ranks that hold one model replica together (the tensor-parallel width; 1 otherwise).
  static constexpr int replica_ranks = [] {
    if constexpr (detail::tensor_sync<Sync>) return static_cast<int>(Sync::width);
    else return 1;
  }();
  /// After a recovery replaced the communicator (world_comm()): forgets the operations in
  /// flight on the old one, and moves the gradients and the exchange's buffer to fresh memory,
  /// since those operations may still write into the old.
  void after_recovery()
    requires recoverable
  {
    sync_.after_recovery();
    model_.renew_gradients();
    chunked_.abandon();  // deterministic mode: subtrees in flight to their owners, their receive buffer
    had_samples_ = false;
  }
  /// The parameters and the optimizer buffers `buffers` of world rank `root` to every rank; a
  /// hybrid's slice, of its replica 0 over the replicas of the slice (the recovery has brought
  /// them all to the same step). Collective over the world.
  void broadcast_state(std::span<T> buffers, int root)
    requires recoverable
  {
    T* params = local_parameters();
    if constexpr (tensor_split) {
      auto& replicas = sync_.replica_comm();
      replicas.broadcast(params, model_type::parameter_count, 0);
      replicas.broadcast(buffers.data(), buffers.size(), 0);
      if (local_buffer_count()) replicas.broadcast(local_buffers(), local_buffer_count(), 0);
    } else {
      auto& world = sync_.world_comm();
      world.broadcast(params, model_type::parameter_count, root);
      world.broadcast(buffers.data(), buffers.size(), root);
      if (local_buffer_count()) world.broadcast(local_buffers(), local_buffer_count(), root);
    }
  }
  /// Whether the optimizer step is committed over the world (a tensor-parallel hybrid that
  /// recovers in the process: detail::step_commit), and whether this step is.
  static constexpr bool commits_steps = requires(Sync& s) { s.commits(); };
  bool commits() const noexcept {
    if constexpr (commits_steps) return sync_.commits();
    else return false;
  }

  std::size_t prepare_fit(std::size_t batch, std::size_t deterministic_chunk) {
    chunks_.reset();
    if (deterministic_chunk == 0) return 0;
    if (compresses()) chunk_plan::refuse(deterministic_chunk, true);
    if constexpr (!deterministic_capable) {
      chunk_plan::refuse(deterministic_chunk, false);
    } else {
      chunks_ = chunk_plan::make(batch, deterministic_chunk, static_cast<std::size_t>(replicas()));
      return chunks_->rank_block();
    }
  }

  /// See loom::engine. Gradients are written on the first micro-step that has samples and
  /// added to after it; a rank without samples contributes zeros.
  loss_value micro_step(const batch_view<T>& b, std::size_t m, std::size_t group, std::uint64_t seed, std::uint64_t step);

  /// Clips the whole model's gradient norm to clip (0: no clipping; over the tensor group when
  /// split), and starts a new optimizer step: the next micro-step writes the gradients afresh.
  void clip_and_close_step(double clip) {
    settle();
    auto grads = model_.gradients();
    if (clip > 0) scale_to_norm<Backend>(grads.data(), grads.size(), gradient_norm(), clip);
    had_samples_ = false;
  }

  /// ZeRO (shard_optimizer_state): clips the whole model's gradient norm, steps this rank's
  /// slices with `state` (the shard's optimizer state), and all-gathers every rank's slices
  /// into the parameters. In the split-invariant mode every rank holds the whole summed
  /// gradient, bitwise the same: the slices are copied from it and the norm is the unsharded
  /// one, so the result is bitwise that of unsharded training.
  /// An optimizer state that cannot step part of itself (detail::steps_in_place) steps a
  /// contiguous copy of the shard's parameters.
  template <class State>
  void sharded_step(State& state, float lr, double clip)
    requires may_shard_state
  {
    T* params = model_.parameters().data();
    auto& fig = sync_.figures();
    double sq = 0;  // the squared norm: the whole model's, or this shard's part of it
    if constexpr (tensor_split) {
      // A slice's shard: split and shared values apart, over both groups.
      if (clip > 0) sq = sync_.template sharded_squares<Backend>(zero_.gradients());
    } else {
      {
        monitor::timed compute(fig, &rank_figures::compute_s);
        const T* grads = model_.gradients().data();
        if (chunks_)
          for (const shard_piece& q : sync_.zero().pieces) Backend::copy(zero_.gradients() + q.local_offset, grads + q.whole_offset, q.count);
        if (clip > 0) sq = chunks_ ? Backend::sum(model_type::parameter_count, detail::squared_term<T>{grads}) : zero_.squares();
      }
      if (clip > 0 && !chunks_) sync_.sum(&sq, 1);
    }
    {
      monitor::timed compute(fig, &rank_figures::compute_s);
      zero_.clip_to(std::sqrt(sq), clip);
      had_samples_ = false;
      zero_.step(state, params, sync_, lr);
    }
    // In flight until the next forward reaches each unit's layers (await_layer, settle()).
    sync_.start_gather_parameters(params);
  }

  /// See loom::engine: forward and loss in evaluation mode.
  loss_value evaluate_batch(const batch_view<T>& b, std::uint64_t seed, std::uint64_t step) {
    settle();
    if (b.n == 0) return {};
    run_context ctx{.training = false, .accumulate = false, .seed = seed, .step = step, .sample_offset = b.offset,
                    .tensor = tensor_group(), .math = math_};
    const T* y = model_.forward(ctx, b.x, b.n);
    return Loss::template compute<Backend, out_width, T>(y, b.labels, nullptr, b.n, T(1), ws_);
  }
  void end_evaluation() {}

  /// Sums over replicas (a tensor group's ranks saw the same samples: counted once).
  void sum(double* values, std::size_t n) { sync_.sum(values, n); }

  rank_figures& figures() { return sync_.figures(); }
  /// Forward FLOPs per sample of the network this rank runs (its slice under tensor parallelism).
  static constexpr double flops_per_sample() { return rank_network::flops_per_sample; }
  void reset_figures() { sync_.figures() = {}; }
  std::vector<rank_figures> gather_figures() { return sync_.gather_figures(); }
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t, std::vector<std::size_t>& dropped) {
    return sync_.gather_timelines(t, dropped);
  }

  /// The L2 norm of the whole model's parameters, summed in double (over the tensor group when
  /// split, replicated values counted once).
  double parameters_l2() {
    settle();
    if constexpr (tensor_split) return sync_.template l2<Backend>(model_.parameters().data());
    else return model_.parameters_l2();
  }
  /// The whole model's flat parameters (Network's layout) as a host vector, on every rank.
  std::vector<T> gather_parameters() {
    settle();
    if constexpr (tensor_split) return sync_.gather_parameters(model_.copy_parameters_to_host());
    else return model_.copy_parameters_to_host();
  }

  /// The loss's label smoothing (engine_setup::label_smoothing), which its workspace carries.
  void set_label_smoothing(float eps) noexcept { ws_.label_smoothing = eps; }

 private:
  static constexpr std::size_t in_width = Network::input_shape::size;
  static constexpr std::size_t out_width = Network::output_shape::size;

  /// The training forward of micro_step. Under ZeRO the parameters may still be on their way
  /// (start_gather_parameters): each layer first waits for the gather of its unit.
  const T* forward_awaiting_parameters(const run_context& ctx, const batch_view<T>& b) {
    if constexpr (may_shard_state) {
      if (sync_.gathering()) {
        const T* y = model_.forward(ctx, b.x, b.n, [this](std::size_t layer) { sync_.await_layer(layer); });
        settle();  // a unit of layers the forward never reached (none in a chain)
        return y;
      }
    }
    return model_.forward(ctx, b.x, b.n);
  }

  /// ZeRO: the shard's reduced gradients, sized for the world as it is, their place given to
  /// the communication, and their blocks of the whole layout (a tensor slice's shard: its pieces
  /// of the slice's blocks, a shared one written by slice 0's ranks).
  void bind_shard() {
    zero_.bind(sync_);
    if constexpr (tensor_split) zero_.set_pieces(sync_.state_pieces());
    else zero_.set_pieces(sync_.zero().pieces);
  }

  /// Whether this run sends its gradients in 16 bits (loom::compress<>).
  bool compresses() const noexcept {
    if constexpr (requires { sync_.compressing(); }) return sync_.compressing();
    else return detail::compresses_v<Sync>;
  }

  static tensor_shard model_shard(const Sync& s) {
    if constexpr (tensor_split) return s.model_shard();
    else return {};
  }
  loom::tensor_group* tensor_group() noexcept {
    if constexpr (tensor_split) return sync_.group();
    else return nullptr;
  }
  /// The replicas a training pass's batch norms sum their statistics over: under
  /// sync_batch_norm with replicas, null otherwise (each replica's statistics its own).
  process_group* batch_norm_replicas() noexcept {
    if constexpr (std::is_void_v<replicas_comm_type>) {
      return nullptr;
    } else {
      if (!sync_batch_norm_) return nullptr;
      if constexpr (detail::replica_comm_sync<Sync>) batch_norm_sums_.bind(&sync_.comm(), &sync_.figures());
      else batch_norm_sums_.bind(&sync_.replica_comm(), &sync_.figures());
      return &batch_norm_sums_;
    }
  }
  double gradient_norm() {
    const T* g = model_.gradients().data();
    if constexpr (tensor_split) return sync_.template l2<Backend>(g);
    else return std::sqrt(Backend::sum(model_type::parameter_count, detail::squared_term<T>{g}));
  }

  /// micro_step in deterministic mode (chunks_ set): each chunk of this rank's samples runs
  /// forward and backward alone from the same buffer; their gradients go into the chunk tree
  /// (from this rank's first chunk), whose sum is finished across ranks by chunk_exchange,
  /// then into the tree over the group's micro-steps, which gradients() gets on the last one
  /// (detail::chunked_steps, written once; only the passes over a chunk are this network's).
  loss_value chunked_micro_step(const batch_view<T>& b, std::size_t m, std::size_t group, std::uint64_t seed,
                                std::uint64_t step);

  using replicas_comm_type = typename detail::replica_comm_of<Sync>::type;
  struct no_sums {};

  Sync sync_;
  math_mode math_;
  model_type model_;
  bool sync_batch_norm_;  // loom::sync_batch_norm (data_parallel_choice::sync_batch_norm)
  [[no_unique_address]] std::conditional_t<std::is_void_v<replicas_comm_type>, no_sums, detail::replica_sums<replicas_comm_type>>
      batch_norm_sums_;
  buffer<T, typename Backend::memory_space> dy_;  // (batch, output): the loss gradient
  loss_workspace<Backend> ws_;
  bool had_samples_ = false;  // gradients of the current optimizer step have been written
  // Deterministic mode: the plan of the current fit; one chunk's input, the sums over chunks
  // and over micro-steps, and the exchange across ranks (buffers only, nothing of the plan).
  std::optional<chunk_plan> chunks_;
  detail::chunked_steps<T, Backend> chunked_;
  // ZeRO (shard_optimizer_state): this rank's slices of the summed gradients and their blocks.
  detail::zero_shard<T, Backend> zero_;
};

template <class Network, class Loss, class Backend, class Sync>
loss_value replica_passes<Network, Loss, Backend, Sync>::micro_step(const batch_view<T>& b, std::size_t m, std::size_t group, std::uint64_t seed, std::uint64_t step) {
  // Synchronized batch norm: a rank without samples in this batch (a short last batch) still
  // runs the passes, over no samples, for its part in the batch norms' sums.
  process_group* const bn_replicas = chunks_ ? nullptr : batch_norm_replicas();
  if (chunks_ || (b.n == 0 && !bn_replicas)) settle();
  if (chunks_) return chunked_micro_step(b, m, group, seed, step);
  // Under ZeRO the forward may wait for the parameters' gathers, and synchronized batch norms
  // for their sums: exposed communication, taken out of the compute time below.
  const double exposed_before = sync_.figures().comm_exposed_s, waited_before = sync_.figures().wait_s;
  monitor::timed compute(sync_.figures(), &rank_figures::compute_s);
  const bool last = m + 1 == group;
  T* grads = model_.gradients().data();
  loss_value v;
  if (b.n > 0 || bn_replicas) {
    dy_.reserve_discard(b.n * out_width);
    run_context ctx{.training = true, .accumulate = m > 0 && had_samples_, .seed = seed, .step = step,
                    .sample_offset = b.offset, .tensor = tensor_group(), .replicas = bn_replicas, .math = math_};
    if (b.n == 0) {  // passes over no samples add nothing to zeroed gradients
      if (!ctx.accumulate) Backend::zero(grads, model_type::parameter_count);
      ctx.accumulate = true;
    }
    {
      monitor::span fw(monitor::span_kind::forward);
      const T* y = forward_awaiting_parameters(ctx, b);
      v = Loss::template compute<Backend, out_width, T>(y, b.labels, dy_.data(), b.n,
                                                        T(1) / static_cast<T>(b.global_n * group), ws_);
    }
    monitor::span bw(monitor::span_kind::backward);
    if (last) {
      // Each layer's backward as a span of its own, between the engine's calls (a clock read
      // per layer, only while a timeline records).
      monitor::timeline* const tl = monitor::current_timeline();
      auto layer_start = tl ? monitor::clock::now() : monitor::clock::time_point{};
      model_.backward(ctx, dy_.data(), b.n, [&](std::size_t layer) {
        if (tl) {
          const auto now = monitor::clock::now();
          tl->add(monitor::span_kind::layer_backward, layer_start, now, static_cast<std::int32_t>(layer));
          layer_start = now;
        }
        sync_.layer_done(layer, grads);
      });
    } else {
      model_.backward(ctx, dy_.data(), b.n);
    }
    bw.stop();
    had_samples_ = true;
  } else if (!(m > 0 && had_samples_)) {
    Backend::zero(grads, model_type::parameter_count);  // nothing of this batch here: contribute zeros
    had_samples_ = true;
  }
  compute.stop();
  if constexpr (may_shard_state) sync_.figures().compute_s -= sync_.figures().comm_exposed_s - exposed_before;
  if (bn_replicas) sync_.figures().compute_s -= sync_.figures().wait_s - waited_before;
  if (last) sync_.finish(grads);
  return v;
}

template <class Network, class Loss, class Backend, class Sync>
loss_value replica_passes<Network, Loss, Backend, Sync>::chunked_micro_step(const batch_view<T>& b, std::size_t m, std::size_t group, std::uint64_t seed,
                              std::uint64_t step) {
  struct passes final : detail::chunk_passes<T> {
    replica_passes& e;
    run_context ctx;
    T scale;
    passes(replica_passes& engine, run_context c, T s) : e(engine), ctx(c), scale(s) {}
    loss_value forward_loss(const T* x, const std::int32_t* labels, std::size_t k, std::size_t offset) override {
      ctx.sample_offset = offset;
      e.dy_.reserve_discard(k * out_width);
      const T* y = e.model_.forward(ctx, x, k);
      return Loss::template compute<Backend, out_width, T>(y, labels, e.dy_.data(), k, scale, e.ws_);
    }
    void backward(std::size_t k) override { e.model_.backward(ctx, e.dy_.data(), k); }
  } p(*this, run_context{.training = true, .accumulate = false, .seed = seed, .step = step, .math = math_},
      T(1) / static_cast<T>(b.global_n * group));
  T* grads = model_.gradients().data();
  constexpr std::size_t count = model_type::parameter_count;
  const auto r = static_cast<std::size_t>(replica()), n = static_cast<std::size_t>(replicas());
  if constexpr (detail::replica_comm_sync<Sync>)
    return chunked_.step(*chunks_, b, m, group, &sync_.comm(), r, n, grads, count, in_width, sync_.figures(), p);
  else
    return chunked_.template step<void>(*chunks_, b, m, group, nullptr, r, n, grads, count, in_width,
                                        sync_.figures(), p);
}

/// Runs one rank of Network's training with Loss and Optimizer on Backend; Sync (see above)
/// communicates. Satisfies loom::engine: the passes (replica_passes) and the optimizer state
/// (detail::with_optimizer).
template <class Network, class Loss, class Optimizer, class Backend, class Sync>
class replica_engine : public detail::with_optimizer<replica_passes<Network, Loss, Backend, Sync>, Optimizer> {
  using base = detail::with_optimizer<replica_passes<Network, Loss, Backend, Sync>, Optimizer>;

 public:
  /// See replica_passes' constructor; also the optimizer state, from setup.optimizer (which
  /// throws for bad options).
  replica_engine(Sync sync, const engine_setup<typename Optimizer::options>& setup)
      : base(setup.optimizer, std::move(sync), setup.seed, setup.math, setup.job, setup.data_parallel.sync_batch_norm) {
    this->set_label_smoothing(setup.label_smoothing);
  }
};

}  // namespace loom
