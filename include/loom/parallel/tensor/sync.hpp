// SPDX-License-Identifier: Apache-2.0
#pragma once
// The communication of tensor parallelism for loom::replica_engine (loom::model_parallel<
// loom::tensor_parallel<T>, Comm>, loom::hybrid<loom::data_parallel<Comm, ...>,
// loom::tensor_parallel<T>>): the grid of ranks, the tensor group the layers' allreduces run over
// (comm_tensor_group), the gradient allreduce across replicas, the shard map of a slice, and
// the gathering of the split model. The policy is in
// loom/parallel/tensor/policy.hpp, the layers in loom/layers/tensor_parallel.hpp.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/parallel/data/data_parallel.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/rank_grid.hpp"
#include "loom/parallel/shard_map.hpp"
#include "loom/parallel/tensor/policy.hpp"
#include "loom/parallel/tensor/plan.hpp"

namespace loom {

/// The tensor_group of the layers over a loom communicator: its allreduces are the
/// communicator's, timed and counted for the rank's figures.
template <class Comm>
class comm_tensor_group final : public tensor_group {
  using clock = std::chrono::steady_clock;

 public:
  explicit comm_tensor_group(Comm comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void allreduce_sum(float* data, std::size_t n) override { reduce(data, n); }
  void allreduce_sum(double* data, std::size_t n) override { reduce(data, n); }
  Comm& comm() noexcept { return comm_; }

  /// Seconds spent in allreduces and bytes sent (as a ring sends them) since the last take().
  std::pair<double, double> take() noexcept { return {std::exchange(seconds_, 0.0), std::exchange(bytes_, 0.0)}; }

 private:
  template <class T>
  void reduce(T* data, std::size_t n) {
    const auto t0 = clock::now();
    comm_.allreduce(data, n, reduce_op::sum);
    seconds_ += std::chrono::duration<double>(clock::now() - t0).count();
    const double k = static_cast<double>(comm_.size());
    bytes_ += k > 1 ? 2.0 * (k - 1) / k * static_cast<double>(n * sizeof(T)) : 0.0;
  }

  Comm comm_;
  double seconds_ = 0, bytes_ = 0;
};

/// One rank's tensor-parallel communication for replica_engine (the interface of
/// gradient_allreduce). World rank r holds slice r % Width of replica r / Width
/// (detail::rank_grid): Width consecutive ranks form a tensor group, which runs the layers'
/// allreduces; with DataParallel (a loom::data_parallel<Comm, ...>, for loom::hybrid) the ranks
/// holding the same slice form a data-parallel group over which every gradient of this rank,
/// split or replicated, is averaged by gradient_allreduce. DataParallel void: one replica, the
/// world is the tensor group.
///
/// replica() / replicas() are the data-parallel index and replica count (what the data loader
/// splits batches by: all ranks of a tensor group read the same samples); rank() / world() the
/// place in the whole world.
template <class Network, class T, class Comm, std::size_t Width, class DataParallel = void>
class tensor_parallel_sync {
  static_assert(communicator<Comm>,
                "loom::tensor_parallel: Comm must be a loom communicator (loom::mpi_comm, loom::local_comm)");
  static constexpr bool hybrid = !std::is_void_v<DataParallel>;
  struct no_data_parallel {};
  template <class D>
  struct dp_engine_of {
    using type = gradient_allreduce<tensor_parallel_network<Network, Width>, T, D>;
  };
  using dp_engine = typename std::conditional_t<hybrid, dp_engine_of<DataParallel>,
                                                std::type_identity<no_data_parallel>>::type;

 public:
  using layout = tensor_parallel_layout<Network, Width>;
  /// The network this rank runs: Network with its tensor-parallel layers sliced.
  using rank_network = typename layout::rank_network;
  static constexpr std::size_t width = Width;
  /// Whether the gradient average over replicas travels compressed (loom::compress<>).
  static constexpr bool compressed = detail::compresses_v<dp_engine>;
  /// ZeRO stage 1 over the replicas (hybrid<data_parallel<Comm, shard_optimizer_state>,
  /// tensor_parallel<W>>, as Megatron-LM's distributed optimizer): each slice's gradients are
  /// reduce-scattered over its data-parallel group, each rank steps its part of its slice
  /// (zero(): in the slice's own flat layout), and the parameters are all-gathered over the group.
  static constexpr bool sharded = detail::shards_state_v<dp_engine>;
  static constexpr bool may_shard = detail::may_shard_state_v<dp_engine>;

  /// Splits world into tensor groups (and data-parallel groups for hybrid). Collective.
  /// Throws: loom::invalid_argument when world's size is not Width (model_parallel) or not a
  /// multiple of it (hybrid) — on every rank alike, before any communication.
  explicit tensor_parallel_sync(Comm world)
      : grid_(std::move(world), {.group = Width, .replicated = hybrid, .member = "slice"},
              std::string(hybrid ? "loom::hybrid<data_parallel, tensor_parallel<" : "loom::model_parallel<tensor_parallel<") +
                  std::to_string(Width) + ">>") {
    group_ = std::make_unique<comm_tensor_group<Comm>>(grid_.split_group());
    if constexpr (hybrid) dp_.emplace(grid_.split_data());
  }

  /// Data-parallel index and replica count, and the place in the whole world.
  int replica() const { return grid_.replica(); }
  int replicas() const { return grid_.replicas(); }
  int rank() const { return grid_.rank(); }
  int world() const { return grid_.size(); }
  /// The communicator over every rank (loom::comm_collectives wraps it).
  Comm& world_comm() { return grid_.world(); }
  /// Failure detection over the whole job (loom::trainer, fault_options): the world
  /// communicator's detector with deadline_s, shared by the tensor group's and (hybrid) the
  /// data-parallel group's communicators. Collective over the world.
  void watch_for_failures(double deadline_s)
    requires detail::part_watching_communicator<Comm>
  {
    grid_.watch_for_failures(deadline_s, group_->comm(), data_comm());
  }
  void set_deadline(double deadline_s)
    requires detail::part_watching_communicator<Comm>
  {
    grid_.set_deadline(deadline_s);
  }

  /// Whether a recovery can go on without lost ranks (hybrid over a communicator that
  /// recovers, loom::mpi_comm): whole replicas go on, and the ranks of a replica that lost one
  /// leave with it (loom::recover_world's group_size, Width). Not under ZeRO (sharded): a lost
  /// rank takes its slices of the optimizer state with it (the run ends; loomrun resumes it
  /// from the last checkpoint).
  static constexpr bool recoverable = hybrid && !may_shard && detail::regrouping_communicator<Comm>;
  /// After a recovery replaced the world communicator with whole replicas (slice r % Width
  /// kept, since whole replicas leave): splits it into tensor and data-parallel groups again,
  /// watched as part of it, and forgets the gradient buckets in flight on the old ones.
  /// Collective over the new world.
  void after_recovery()
    requires recoverable
  {
    grid_.after_recovery(group_->comm(), data_comm());
    dp_->after_recovery();
    (void)group_->take();  // the time of the failed step's allreduces is not the step's to account
  }
  /// The communicator over the replicas of this rank's slice (a recovery shares the slice's
  /// state over it).
  Comm& replica_comm()
    requires hybrid
  {
    return dp_->comm();
  }
  /// Whether each optimizer step can be committed over the world before it is taken
  /// (detail::step_commit, where the fit recovers): under failure detection, with several
  /// replicas.
  bool commits() const noexcept {
    if constexpr (recoverable) return grid_.commits();
    else return false;
  }
  /// ZeRO (sharded): see gradient_allreduce — the slice's layout cut over the data-parallel
  /// group, where its reduced gradients go, the parameters' allgathers after the step.
  bool sharding() const noexcept {
    if constexpr (may_shard) return dp_->sharding();
    else return false;
  }
  const zero_layout& zero() const noexcept
    requires may_shard
  {
    return dp_->zero();
  }
  /// Also makes the state's blocks of the whole layout (state_pieces) for the world as it is.
  void bind_shard(T* where)
    requires may_shard
  {
    dp_->bind_shard(where);
    state_pieces_ = compose(shard().pieces, dp_->zero().pieces);
  }
  void start_gather_parameters(T* params)
    requires may_shard
  {
    dp_->start_gather_parameters(params);
  }
  bool gathering() const noexcept {
    if constexpr (may_shard) return dp_->gathering();
    else return false;
  }
  void await_layer(std::size_t layer) {
    if constexpr (may_shard) dp_->await_layer(layer);
  }
  void settle() {
    if constexpr (may_shard) dp_->settle();
  }
  /// ZeRO: the blocks of the whole layout this rank's shard holds (its slice's blocks cut by
  /// zero().pieces; a shared block — a replicated layer, a row_parallel bias — stays shared).
  std::span<const shard_piece> state_pieces() const noexcept { return state_pieces_; }
  /// ZeRO: the whole model's squared gradient norm from this rank's shard of reduced
  /// gradients: the shard's squares of split and of shared values summed over the
  /// data-parallel group (its slice's), the split ones then over the tensor group (shared ones
  /// counted once, as l2). Collective over both groups.
  template <class Backend>
  double sharded_squares(const T* shard)
    requires may_shard
  {
    std::array<double, 2> s{0, 0};
    for (const shard_piece& p : state_pieces_)
      s[p.shared ? 1 : 0] += Backend::sum(p.size(), detail::squared_term<T>{shard + p.local_offset});
    dp_->sum(s.data(), 2);
    if constexpr (Width > 1) tensor_comm().allreduce(s.data(), 1, reduce_op::sum);
    return s[0] + s[1];
  }

  /// This rank's slice of the tensor-parallel layers, for the model's construction.
  tensor_shard model_shard() const { return {slice(), Width}; }
  /// What this rank holds: slice rank() % Width of the whole network's layout, as replica
  /// rank() / Width (shards::slice).
  shard_map shard() const { return shard_of(std::make_index_sequence<Width>{}); }
  /// Slice I's blocks of the whole layout, at compile time.
  template <std::size_t I>
  static constexpr auto pieces_of = shards::slice<layout, I>;
  /// The tensor group, for run_context::tensor; valid as long as the engine (moves keep it).
  tensor_group* group() noexcept { return group_.get(); }
  Comm& tensor_comm() noexcept { return group_->comm(); }

  /// Checks that every rank of the world runs the same job (the description plus the grid);
  /// every rank throws the same loom::communication_error naming the ranks and the fields that
  /// differ otherwise. Collective over the world.
  void check_same_job(const std::string& description) {
    detail::check_same_job(grid_.world(), description + ";tensor_parallel=" + std::to_string(Width) + ";world=" +
                                       std::to_string(grid_.size()),
                           "loom::tensor_parallel");
  }

  /// Makes every replica of this slice start from replica 0's values (hybrid; one replica:
  /// nothing to do — every slice initialises as its part of the whole model). Collective.
  void broadcast_parameters(T* params, std::size_t n) {
    if constexpr (hybrid) dp_->broadcast_parameters(params, n);
  }

  /// Backward finished layer `layer` on the last micro-step: starts the gradient buckets that
  /// are complete (hybrid).
  void layer_done(std::size_t layer, T* grads) {
    if constexpr (hybrid) dp_->layer_done(layer, grads);
  }

  /// Completes the gradient allreduce across replicas (hybrid), and accounts the tensor
  /// group's allreduces of the step (blocking: all of it exposed).
  void finish(T* grads) {
    if constexpr (hybrid) dp_->finish(grads);
    const auto [s, bytes] = group_->take();
    rank_figures& f = figures();
    f.comm_s += s;
    f.comm_exposed_s += s;
    f.bytes_sent += bytes;
    f.bus_bytes += bytes;
  }

  /// Sums values over the replicas (each tensor group counted once: its ranks saw the same
  /// samples). Collective over the data-parallel group.
  void sum(double* values, std::size_t n) {
    if constexpr (hybrid) dp_->sum(values, n);
  }

  rank_figures& figures() {
    if constexpr (hybrid) return dp_->figures();
    else return figures_;
  }

  /// Every rank's figures on every rank, world rank order. Collective over the world.
  std::vector<rank_figures> gather_figures() {
    rank_figures f = figures();
    f.parameter_bytes = static_cast<double>(rank_network::parameter_count * sizeof(T));
    return loom::gather_figures(grid_.world(), f);
  }

  /// Every rank's spans on world rank 0 (collective over the world).
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t, std::vector<std::size_t>& dropped) {
    return monitor::gather_timelines(grid_.world(), t, dropped);
  }

  /// The whole model's flat parameters in Network's layout from this rank's slice (host
  /// memory, rank_network's layout). Collective over the tensor group.
  std::vector<T> gather_parameters(std::vector<T> mine) {
    if (mine.size() != rank_network::parameter_count)
      throw invalid_argument("loom::tensor_parallel_sync::gather_parameters: expected " +
                             std::to_string(rank_network::parameter_count) + " values, got " +
                             std::to_string(mine.size()));
    std::vector<T> slices(Width * rank_network::parameter_count), whole(Network::parameter_count);
    tensor_comm().allgather(mine.data(), slices.data(), mine.size());
    layout::gather(slices.data(), whole.data());
    return whole;
  }

  /// The L2 norm of the whole model's values (parameters or gradients) from this rank's slice
  /// v (rank_network's layout, Backend's memory): split values' squares summed over the tensor
  /// group, replicated ones counted once. Collective over the tensor group.
  template <class Backend>
  double l2(const T* v, std::size_t = rank_network::parameter_count) {
    std::array<double, 2> s = layout::template split_squares<Backend>(v);
    if constexpr (Width > 1) tensor_comm().allreduce(s.data(), 1, reduce_op::sum);
    return std::sqrt(s[0] + s[1]);
  }

 private:
  std::size_t slice() const { return static_cast<std::size_t>(grid_.place()); }
  /// The data-parallel group's communicator (hybrid), else null.
  Comm* data_comm() {
    if constexpr (hybrid) return &dp_->comm();
    else return nullptr;
  }
  template <std::size_t... S>
  shard_map shard_of(std::index_sequence<S...>) const {
    shard_map m{.replica = replica(), .replicas = replicas(), .slice = static_cast<int>(slice()),
                .slices = static_cast<int>(Width), .whole_count = Network::parameter_count,
                .local_count = rank_network::parameter_count};
    ((S == slice() ? (m.pieces = shards::slice<layout, S>, 0) : 0), ...);
    return m;
  }

  detail::rank_grid<Comm> grid_;
  std::unique_ptr<comm_tensor_group<Comm>> group_;
  std::optional<dp_engine> dp_;
  rank_figures figures_;
  std::vector<shard_piece> state_pieces_;  // ZeRO: see state_pieces()
};

}  // namespace loom
