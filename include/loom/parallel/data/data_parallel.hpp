// SPDX-License-Identifier: Apache-2.0
#pragma once
#define LOOM_PARALLEL_DATA_PARALLEL_HPP 1
// loom::data_parallel<Comm, Options...>: every rank holds the whole model and trains on its
// share of every global batch; gradients are averaged by allreduce in buckets that start while
// backward still runs. This file holds the policy type and its gradient communication
// (gradient_allreduce); the engine the trainer drives is loom::replica_engine
// (loom/parallel/data/replica_engine.hpp), the communicators live in loom/comm/.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/half.hpp"
#include "loom/core/memory.hpp"
#include "loom/parallel/data/bucket_plan.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom {

/// Option of data_parallel: the most bytes of gradients one allreduce carries (default 25 MiB,
/// as PyTorch DDP). Smaller buckets start earlier and overlap more; larger ones cost fewer calls.
template <std::size_t Bytes>
struct bucket_bytes {
  static constexpr std::size_t value = Bytes;
};

/// Option of data_parallel: gradients are sent as H (loom::bf16 or loom::fp16), summed in
/// float at each step of the reduction and rounded back to 16 bits between steps — half the
/// bytes of float, as PyTorch DDP's bf16_compress_hook, Horovod's Compression.fp16 and llm.c's
/// bf16 gradients. The gradients themselves, the optimizer and the parameters stay float.
/// bf16 keeps float's range (no overflow, no underflow to speak of) with 8 significant bits;
/// fp16 has 11 but overflows past 65504 and loses gradients below 6e-8 (docs/data-parallel.md).
template <class H>
struct compress {
  static_assert(is_half_v<H>, "loom::compress<H>: H must be loom::bf16 or loom::fp16");
  using type = H;
};

/// Option of data_parallel: ZeRO stage 1 (Rajbhandari et al., as DeepSpeed's stage 1 and
/// PyTorch's ZeroRedundancyOptimizer). Each bucket's gradients are reduce-scattered instead of
/// all-reduced, still while backward runs: rank r receives the sum of its slice r of every
/// bucket (about 1/N of the model), keeps the optimizer state of those slices only, steps
/// them, and every rank's updated slices are then all-gathered into every replica's
/// parameters. Optimizer-state memory per rank falls to about 1/N; the bytes on the wire are
/// those of an allreduce (a reduce-scatter and an allgather). The state is no longer
/// replicated: a rank lost takes its slice of it with it, so such a run is not recovered in
/// place — it ends, and loomrun resumes it from the last checkpoint, resharded
/// (docs/data-parallel.md, "Sharded optimizer state").
struct shard_optimizer_state {};

/// Option of data_parallel: synchronized batch norm (PyTorch's SyncBatchNorm). In training,
/// every loom::batch_norm normalises with the statistics of the global batch rather than of
/// its replica's share: each replica's per-channel sums and count are summed over the
/// data-parallel replicas in forward, and the two per-channel gradient sums in backward (two
/// small allreduces per batch norm, 2C+1 and 2C doubles, on the critical path); evaluation
/// uses the running statistics and communicates nothing. The running statistics then agree on
/// every replica. The weight and bias gradients stay each replica's own and are averaged with
/// the other gradients. Off by default, as in PyTorch DDP: with a few dozen samples per
/// replica the replica's statistics are as good and cost nothing; synchronize when the share
/// per replica is small (detection, segmentation, large images). Under loom::hybrid with
/// tensor_parallel, over the replicas of a slice (every slice holds whole batch norms); a
/// pipeline's batch norms normalise per micro-batch (as GPipe) and are not synchronized; in
/// the split-invariant mode (fit_options::deterministic_chunk) each chunk is a batch norm's
/// batch (docs/perception.md, "Synchronized batch norm").
struct sync_batch_norm {};

/// Option of data_parallel: the wire format (compress<>) and ZeRO (shard_optimizer_state) are
/// chosen when the trainer is built, as a loom::data_parallel_choice (loom::trainer's
/// constructors that take one), rather than named here: for a program that takes them from a
/// flag. Its runs are bitwise those of the policy that names the same options, and describe
/// themselves as it (job checks, checkpoints). Every rank must choose alike (checked). Not
/// with compress<> or shard_optimizer_state, nor under loom::hybrid.
struct choose_at_run_time {};

namespace detail {
template <class T>
inline constexpr bool is_compress_v = false;
template <class H>
inline constexpr bool is_compress_v<compress<H>> = true;
// compress<H> with an H that is no wire float (compress's own static_assert fires only where
// the class is instantiated, which naming it among the options does not do).
template <class T>
inline constexpr bool is_bad_compress_v = false;
template <class H>
inline constexpr bool is_bad_compress_v<compress<H>> = !is_half_v<H>;

template <class... Options>
struct wire_of {
  using type = void;
};
template <class First, class... Rest>
struct wire_of<First, Rest...> : wire_of<Rest...> {};
template <class H, class... Rest>
struct wire_of<compress<H>, Rest...> {
  using type = H;
};
template <class... Options>
constexpr bool compress_once() {
  constexpr std::size_t n = (std::size_t{0} + ... + (is_compress_v<Options> ? 1 : 0));
  static_assert(n <= 1, "loom::data_parallel: compress<...> is given more than once; keep one");
  return true;
}

template <class T>
inline constexpr bool is_bucket_bytes_v = false;
template <std::size_t B>
inline constexpr bool is_bucket_bytes_v<bucket_bytes<B>> = true;

template <class... Options>
constexpr std::size_t bucket_cap_of() {
  constexpr std::size_t n = (std::size_t{0} + ... + (is_bucket_bytes_v<Options> ? 1 : 0));
  static_assert(n <= 1, "loom::data_parallel: bucket_bytes<...> is given more than once; keep one");
  std::size_t cap = std::size_t{25} << 20;
  (
      [&] {
        if constexpr (is_bucket_bytes_v<Options>) cap = Options::value;
      }(),
      ...);
  return cap;
}
template <class... Options>
constexpr bool shards_state_of() {
  constexpr std::size_t n = (std::size_t{0} + ... + (std::is_same_v<Options, shard_optimizer_state> ? 1 : 0));
  static_assert(n <= 1, "loom::data_parallel: shard_optimizer_state is given more than once; keep one");
  return n == 1;
}
template <class... Options>
constexpr bool syncs_batch_norm_of() {
  constexpr std::size_t n = (std::size_t{0} + ... + (std::is_same_v<Options, sync_batch_norm> ? 1 : 0));
  static_assert(n <= 1, "loom::data_parallel: sync_batch_norm is given more than once; keep one");
  return n == 1;
}
template <class Option>
inline constexpr bool is_data_parallel_option_v = is_bucket_bytes_v<Option> || is_compress_v<Option> ||
                                                  std::is_same_v<Option, shard_optimizer_state> ||
                                                  std::is_same_v<Option, sync_batch_norm> ||
                                                  std::is_same_v<Option, choose_at_run_time>;

/// Whether policy D shards the optimizer state (a data_parallel with shard_optimizer_state).
template <class D>
inline constexpr bool shards_state_of_v = [] {
  if constexpr (requires { D::shards_state; }) return D::shards_state;
  else return false;
}();

/// Whether Comm offers the collectives of ZeRO (blocks of different sizes).
template <class C>
concept sharding_communicator = requires(C& c, float* p, const float* cp, const std::size_t* n) {
  { c.ireduce_scatter_v(cp, p, n, reduce_op::sum) } -> std::same_as<typename C::request>;
  { c.iallgather_v(p, n) } -> std::same_as<typename C::request>;
  c.reduce_scatter_v(cp, p, n, reduce_op::sum);
  c.allgather_v(p, n);
};
}  // namespace detail

/// Data parallelism over communicator Comm (loom::mpi_comm, loom::local_comm). Options, in any
/// order: bucket_bytes<N>, compress<bf16> or compress<fp16>, shard_optimizer_state,
/// sync_batch_norm; or choose_at_run_time in place of the last three.
template <class Comm, class... Options>
struct data_parallel {
  static_assert(communicator<Comm>,
                "loom::data_parallel<Comm>: Comm must be a loom communicator (loom::mpi_comm from "
                "<loom/comm/mpi.hpp> or loom::local_comm from <loom/comm/local.hpp>)");
  static_assert((detail::is_data_parallel_option_v<Options> && ...),
                "loom::data_parallel<Comm, Options...>: an option is not one of data_parallel's (bucket_bytes<N>, "
                "compress<bf16>, compress<fp16>, shard_optimizer_state, sync_batch_norm, choose_at_run_time)");
  static_assert(!(detail::is_bad_compress_v<Options> || ...),
                "loom::compress<H>: H must be loom::bf16 or loom::fp16 (the 16-bit wire floats of loom/core/half.hpp)");
  static_assert(detail::compress_once<Options...>());
  using comm_type = Comm;
  /// ZeRO stage 1 (shard_optimizer_state).
  static constexpr bool shards_state = detail::shards_state_of<Options...>();
  static_assert(!shards_state || detail::sharding_communicator<Comm>,
                "loom::shard_optimizer_state: this communicator has no ireduce_scatter_v / iallgather_v (blocks of "
                "different sizes); use loom::mpi_comm, loom::hierarchical_comm, loom::nccl_comm or loom::local_comm");
  static constexpr std::size_t bucket_cap_bytes = detail::bucket_cap_of<Options...>();
  /// Synchronized batch norm (sync_batch_norm).
  static constexpr bool syncs_batch_norm = detail::syncs_batch_norm_of<Options...>();
  /// What gradients travel as: loom::bf16 or loom::fp16 under compress<>, void (their own type) otherwise.
  using wire_type = typename detail::wire_of<Options...>::type;
  /// The wire format and ZeRO chosen at run time (choose_at_run_time). The trainer's shared code
  /// (detail::code_policy, loom/train/trainer.hpp) keys every data_parallel policy over one
  /// communicator by that option, so that the trainers of every wire format and ZeRO choice
  /// share one compiled body; the choice arrives as a data_parallel_choice.
  static constexpr bool chooses_at_run_time = (std::is_same_v<Options, choose_at_run_time> || ...);
  static_assert(!chooses_at_run_time || (std::is_void_v<wire_type> && !shards_state && !syncs_batch_norm),
                "loom::data_parallel<Comm, ..., loom::choose_at_run_time>: the wire format, ZeRO and synchronized "
                "batch norm are then chosen at run time (loom::data_parallel_choice); drop compress<>, "
                "shard_optimizer_state and sync_batch_norm from the policy");
};

template <class T>
inline constexpr bool is_data_parallel_v = false;
template <class C, class... O>
inline constexpr bool is_data_parallel_v<data_parallel<C, O...>> = true;

namespace detail {
/// The run-time form of data_parallel policy D's wire format, ZeRO and synchronized batch norm
/// options (a hybrid: its data_parallel's synchronized batch norm; defaults for any other policy).
template <class D>
constexpr data_parallel_choice data_parallel_choice_of() {
  data_parallel_choice c;
  if constexpr (is_data_parallel_v<D>) {
    if constexpr (std::is_same_v<typename D::wire_type, bf16>) c.wire = gradient_wire::bf16;
    else if constexpr (std::is_same_v<typename D::wire_type, fp16>) c.wire = gradient_wire::fp16;
    c.shard_state = D::shards_state;
    c.sync_batch_norm = D::syncs_batch_norm;
  } else if constexpr (requires { D::data_parallel_type::syncs_batch_norm; }) {
    c.sync_batch_norm = D::data_parallel_type::syncs_batch_norm;  // a hybrid's data-parallel group
  }
  return c;
}

/// Whether data_parallel policy D synchronizes batch norm (false for any other type).
template <class D>
inline constexpr bool syncs_batch_norm_v = [] {
  if constexpr (is_data_parallel_v<D>) return D::syncs_batch_norm;
  else return false;
}();

/// Whether Policy takes data parallelism's wire format and ZeRO at run time
/// (data_parallel<Comm, ..., choose_at_run_time>); false for any other policy.
template <class Policy>
inline constexpr bool chooses_at_run_time_v = [] {
  if constexpr (is_data_parallel_v<Policy>) return Policy::chooses_at_run_time;
  else return false;
}();
}  // namespace detail

namespace detail {
/// The fields of a job description `key=value;key=value` that differ between a (rank 0's) and
/// b, compared by key in a's order (then b's keys that a lacks), as
/// " [b's field] where rank 0 has [a's field]" each; a missing field reads "(none)".
LOOM_DECL std::string job_field_diff(const std::string& a, const std::string& b);

/// Every rank of comm describes its job as `key=value` fields; all ranks gather all
/// descriptions, and if any differs from rank 0's, every rank throws the same
/// communication_error, starting with `who`, naming the ranks and the fields that differ.
/// Collective over comm (an allreduce of the longest description's length, then an allgather).
/// Used by every engine.
template <class Comm>
void check_same_job(Comm& comm, const std::string& description, const std::string& who) {
  std::uint64_t width = description.size() + 1;
  comm.allreduce(&width, 1, reduce_op::max);
  const int world = comm.size();
  std::vector<char> mine(width, '\0'), all(width * static_cast<std::size_t>(world), '\0');
  std::memcpy(mine.data(), description.data(), description.size());
  comm.allgather(mine.data(), all.data(), width);
  std::string message;
  const std::string first(all.data());
  for (int r = 1; r < world; ++r) {
    const std::string other(all.data() + width * static_cast<std::size_t>(r));
    if (other != first) message += "\n  rank " + std::to_string(r) + " differs from rank 0:" + job_field_diff(first, other);
  }
  if (!message.empty())
    throw communication_error(who + ": the ranks do not run the same job (" + std::to_string(world) +
                              " ranks); every rank stops:" + message);
}
}  // namespace detail

/// Where each rank's slices lie under shard_optimizer_state (ZeRO stage 1): bucket b of the
/// bucket plan (offset o, count c) is cut at o + j * c / N for j = 0 .. N, and rank j owns
/// slice j; a rank's shard is its slices of every bucket, in bucket order. The same on every
/// rank for one world size; made again when the world changes.
struct zero_layout {
  std::size_t rank = 0, ranks = 1;
  std::vector<std::size_t> counts;    ///< counts[b * ranks + j]: rank j's slice of bucket b
  std::vector<std::size_t> begins;    ///< begins[b]: this rank's slice of bucket b, in the whole layout
  std::vector<std::size_t> shard_at;  ///< shard_at[b]: where that slice lies in this rank's shard
  std::vector<shard_piece> pieces;    ///< this rank's non-empty slices: whole layout -> shard
  std::size_t shard_count = 0;        ///< values in this rank's shard
  std::size_t largest_shard = 0;      ///< the most any rank holds

  /// The parameters' allgather after the step, in the order the forward needs them: runs of
  /// consecutive layers of one bucket (the first layers' first), each closed before a layer
  /// that would take it above gather_unit_bytes (a larger layer is a unit of its own). Unit u
  /// is [offset, offset + count) of the whole layout; rank j sends unit_counts[u * ranks + j]
  /// values of it: the part of its slice of the bucket that lies there (0 for some).
  struct gather_unit {
    std::size_t first_layer = 0, last_layer = 0;
    std::size_t offset = 0, count = 0;
  };
  std::vector<gather_unit> units;
  std::vector<std::size_t> unit_counts;
  std::vector<std::size_t> layer_unit;  ///< layer_unit[l]: the unit of layer l's parameters (units.size(): none)

  /// The layout of the buckets `buckets` on rank `rank` of `ranks`; with the layers'
  /// parameter counts `layer_counts` (in layer order), also the gather units.
  LOOM_DECL static zero_layout make(std::span<const gradient_bucket> buckets, std::size_t rank, std::size_t ranks,
                                    std::span<const std::size_t> layer_counts = {});
  const std::size_t* counts_of(std::size_t b) const noexcept { return counts.data() + b * ranks; }
  std::size_t mine(std::size_t b) const noexcept { return counts[b * ranks + rank]; }
  const std::size_t* unit_counts_of(std::size_t u) const noexcept { return unit_counts.data() + u * ranks; }
};

/// The cap of a ZeRO gather unit (zero_layout::gather_unit): the forward's first layers do
/// not wait for the whole model, and a network of many small layers does not pay a collective
/// per layer.
inline constexpr std::size_t gather_unit_bytes = std::size_t{1} << 20;

namespace detail {
/// LOOM_ZERO_GATHER: `overlapped` (or unset: true) or `blocking` (false); throws
/// invalid_argument for any other value.
LOOM_DECL bool zero_gather_overlapped_from_environment();

/// The work of gradient_allreduce (below) over a run-time view of its bucket plan: one class per
/// scalar, communicator and choice of wire format and ZeRO, whatever the network, so that a
/// program's networks share its code (and loom::compiled_mpi holds it for loom::mpi_comm).
template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
class bucket_allreduce {
  using comm_t = Comm;
  using clock = monitor::clock;
  using wire_type = Wire;
  static constexpr bool at_run_time = AtRunTime;

 public:
  /// Whether gradients travel compressed (Wire: loom::bf16 or loom::fp16, from compress<>):
  /// converted into a 16-bit copy in host memory as each bucket starts, reduced there,
  /// converted back as it completes. (Under a run-time choice: false here, compressing() says.)
  static constexpr bool compressed = !std::is_void_v<wire_type>;
  /// Whether the optimizer state is sharded (Sharded: loom::shard_optimizer_state, ZeRO stage
  /// 1): each bucket is reduce-scattered into this rank's slice of it (zero()), in the
  /// shard buffer the engine binds (bind_shard), and start_gather_parameters all-gathers the stepped
  /// slices. (Under a run-time choice: false here, sharding() says.)
  static constexpr bool sharded = Sharded;
  /// Whether this class may compress or shard: its policy does, or the choice is made at run time
  /// (the code of both is compiled then; ZeRO's only over a communicator that offers it).
  static constexpr bool may_compress = compressed || at_run_time;
  static constexpr bool may_shard = sharded || (at_run_time && detail::sharding_communicator<comm_t>);

  /// Over comm, with the bucket plan `buckets` (in the order they become ready) of a layout of
  /// `parameter_count` values, `starts_after_layer[l]` the bucket that layer l's backward
  /// completes (buckets.size(): none); the wire format and ZeRO of `choice` (under a fixed
  /// policy, the policy's own: Wire and Sharded).
  /// `layer_counts` the parameters of each layer (in layer order; the gather units of ZeRO).
  bucket_allreduce(comm_t comm, data_parallel_choice choice, std::span<const gradient_bucket> buckets,
                   std::span<const std::size_t> starts_after_layer, std::span<const std::size_t> layer_counts,
                   std::size_t parameter_count);
  // Moved and destroyed out of line (defaulted below), so that the library's instantiation
  // serves a program's engines too.
  bucket_allreduce(bucket_allreduce&&) noexcept;
  bucket_allreduce& operator=(bucket_allreduce&&) noexcept;
  ~bucket_allreduce();

  /// Whether gradients travel in 16 bits, and whether the optimizer state is sharded, in this run.
  bool compressing() const noexcept { return may_compress && wire_ != gradient_wire::native; }
  bool sharding() const noexcept { return may_shard && sharded_; }

  /// ZeRO: this rank's slices (for the world as it is now).
  const zero_layout& zero() const noexcept
    requires may_shard
  {
    return zero_;
  }
  /// ZeRO: where the reduced slices go (zero().shard_count values in the backend's memory).
  void bind_shard(T* shard) noexcept { shard_ = shard; }

  /// This rank in the world and the world's size; every rank is a replica of the whole model.
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.size(); }
  int replica() const { return comm_.rank(); }
  int replicas() const { return comm_.size(); }
  comm_t& comm() { return comm_; }
  /// The communicator over every rank (loom::comm_collectives wraps it).
  comm_t& world_comm() { return comm_; }

  /// Every rank describes its job as `key=value` fields; all ranks gather all descriptions,
  /// and if any differs from rank 0's, every rank throws the same message naming the ranks and
  /// the fields that differ. Collective.
  void check_same_job(const std::string& description) { detail::check_same_job(comm_, description, "loom::data_parallel"); }

  /// Makes every replica start from rank 0's parameters. Collective.
  void broadcast_parameters(T* params, std::size_t n) { comm_.broadcast(params, n, 0); }

  /// Called after backward finished layer `layer` on the last micro-step: starts the bucket
  /// that became complete, and lets MPI progress the ones in flight.
  void layer_done(std::size_t layer, T* grads);

  /// Starts the buckets not yet started (all of them when this rank had no samples), runs the
  /// last one as a blocking allreduce, waits for every bucket, and accounts the time. After it,
  /// grads holds the sum over ranks. Every rank issues the same collectives in the same order.
  void finish(T* grads);

  /// After a recovery replaced the communicator: forgets the buckets in flight on the old one
  /// (abandoned: never waited for).
  void after_recovery();

  /// Sums values over ranks (losses, counts for reporting). Collective.
  void sum(double* values, std::size_t n);

  /// ZeRO, overlapped with the next forward: starts the allgathers of every rank's stepped
  /// slices into params (the whole layout), one per gather unit (zero_layout::gather_unit) in
  /// the order the forward needs them, and returns. await_layer completes them as the forward
  /// reaches their layers; settle completes the rest. Collective (every rank starts the same
  /// gathers in the same order).
  void start_gather_parameters(T* params)
    requires may_shard;
  /// Whether gathers started by start_gather_parameters are still in flight: params may not
  /// be read (nor written) until await_layer or settle has completed them.
  bool gathering() const noexcept { return !gathers_.empty(); }
  /// Whether start_gather_parameters leaves the gathers to the next forward (true, the
  /// default) or waits for them itself (false: every unit complete when the step returns).
  /// The default is LOOM_ZERO_GATHER's: `overlapped` (or unset) or `blocking`; the collectives
  /// are the same either way, so ranks may differ in it.
  bool gather_overlapped() const noexcept { return overlap_gather_; }
  void set_gather_overlapped(bool on) noexcept { overlap_gather_ = on; }
  /// Before layer `layer`'s forward: waits for the gathers up to the one of the unit that
  /// holds the layer's parameters (they complete in the order they were started), lets MPI
  /// progress the next one, and accounts the wait as exposed communication. Nothing to do
  /// when no gather is in flight or the layer has no parameters.
  void await_layer(std::size_t layer);
  /// Waits for every gather still in flight (exposed communication).
  void settle();

  rank_figures& figures() { return figures_; }

  /// Gathers every rank's figures on every rank (collective), rank order.
  std::vector<rank_figures> gather_figures() { return loom::gather_figures(comm_, figures_); }
  /// Every rank's spans on rank 0 (collective).
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t, std::vector<std::size_t>& dropped) {
    return monitor::gather_timelines(comm_, t, dropped);
  }

 private:
  void start(std::size_t b, T* grads);
  /// Calls f with a null pointer of the wire type of this run (loom::bf16 or loom::fp16).
  template <class F>
  decltype(auto) on_wire(F&& f) {
    if constexpr (!at_run_time) {
      return f(static_cast<wire_type*>(nullptr));
    } else {
      if (wire_ == gradient_wire::bf16) return f(static_cast<bf16*>(nullptr));
      return f(static_cast<fp16*>(nullptr));
    }
  }
  /// Posts bucket b's reduction: an allreduce of it in place, or under ZeRO a reduce-scatter
  /// into this rank's slice of the shard (16-bit copies of both when compressed).
  typename comm_t::request post(std::size_t b, T* grads);
  /// Compressed: bucket b's reduced values back into float (its slice of the shard under ZeRO).
  void unwire(std::size_t b, T* grads);
  void make_layout();
  void account(const gradient_bucket& bk);
  /// Request i was seen complete now: its values back into the gradients when compressed, and
  /// onto the timeline (when one is attached).
  void completed(std::size_t i, T* grads);
  /// The 16-bit copy of the gradients in H (the whole layout), or under ZeRO of this rank's
  /// reduced slices (shard).
  template <class H>
  buffer<H, host_space>& wire_buffer(bool shard) {
    if constexpr (std::is_same_v<H, bf16>) return shard ? wire_shard_bf16_ : wire_bf16_;
    else return shard ? wire_shard_fp16_ : wire_fp16_;
  }
  /// Compressed: bucket bk's gradients rounded into their place in the 16-bit copy (allocated
  /// on first use), which the collective then reduces.
  template <class H>
  H* wire(const T* grads, const gradient_bucket& bk) {
    buffer<H, host_space>& w = wire_buffer<H>(false);
    if (w.size() != parameter_count_) w = buffer<H, host_space>(parameter_count_);
    to_half(grads + bk.offset, w.data() + bk.offset, bk.count);
    return w.data() + bk.offset;
  }

  /// Bytes of one gradient on the wire.
  std::size_t wire_bytes() const noexcept { return compressing() ? 2 : sizeof(T); }

  /// A bucket in flight: which, when it was posted, whether it was seen complete.
  struct flight {
    std::int32_t bucket;
    clock::time_point posted;
    bool done = false;
  };

  /// Gathers [0, upto) of gathers_ are complete: waits for the ones that are not (exposed
  /// time), accounts them, and forgets every gather once all are done.
  void complete_gathers(std::size_t upto);

  comm_t comm_;
  std::span<const gradient_bucket> buckets_;         // the plan (the network's static arrays)
  std::span<const std::size_t> starts_after_layer_;  // per layer: the bucket it completes
  std::span<const std::size_t> layer_counts_;        // per layer: its parameters
  // ZeRO's gathers in flight (start_gather_parameters), one per gather unit in unit order;
  // gathers_done_ of them are complete.
  struct gather {
    typename comm_t::request request;
    std::size_t unit;
    clock::time_point posted;
  };
  std::vector<gather> gathers_;
  std::size_t gathers_done_ = 0;
  bool overlap_gather_ = true;
  std::size_t parameter_count_;
  std::vector<typename comm_t::request> requests_;
  std::vector<flight> flights_;  // one per request
  gradient_wire wire_ = gradient_wire::native;
  bool sharded_ = false;
  // Compressed: the gradients' 16-bit copy the collectives reduce, and under ZeRO this rank's
  // reduced slices in 16 bits; in the wire type of the run (the others stay empty).
  buffer<bf16, host_space> wire_bf16_, wire_shard_bf16_;
  buffer<fp16, host_space> wire_fp16_, wire_shard_fp16_;
  zero_layout zero_;    // ZeRO: this rank's slices (empty otherwise)
  T* shard_ = nullptr;  // ZeRO: the engine's shard of reduced gradients
  std::size_t started_ = 0;
  clock::time_point first_start_{};
  rank_figures figures_;
};

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::bucket_allreduce(comm_t comm, data_parallel_choice choice,
                                                                     std::span<const gradient_bucket> buckets,
                                                                     std::span<const std::size_t> starts_after_layer,
                                                                     std::span<const std::size_t> layer_counts,
                                                                     std::size_t parameter_count)
    : comm_(std::move(comm)), buckets_(buckets), starts_after_layer_(starts_after_layer), layer_counts_(layer_counts),
      parameter_count_(parameter_count) {
  if constexpr (at_run_time) {
    if (choice.shard_state && !may_shard)
      throw invalid_argument("loom::shard_optimizer_state: this communicator has no ireduce_scatter_v / iallgather_v");
    wire_ = choice.wire;
    sharded_ = choice.shard_state;
  } else {
    wire_ = choice.wire;
    sharded_ = sharded;
  }
  if (sharding()) {
    make_layout();
    overlap_gather_ = zero_gather_overlapped_from_environment();
  }
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::bucket_allreduce(bucket_allreduce&&) noexcept = default;
template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>& bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::operator=(
    bucket_allreduce&&) noexcept = default;
template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::~bucket_allreduce() = default;

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::layer_done(std::size_t layer, T* grads) {
  const std::size_t b = starts_after_layer_[layer];
  // The last bucket becomes ready when backward is (nearly) over: nothing is left to overlap
  // it with, and a blocking allreduce is faster than a non-blocking one (measured with Open
  // MPI 4.1, 2 ranks: MPI_Iallreduce + wait reaches 0.4-0.5x MPI_Allreduce's bandwidth from
  // 1 MiB up; benchmarks/allreduce). finish() runs it.
  if (b + 1 < buckets_.size()) start(b, grads);
  for (std::size_t i = 0; i < requests_.size(); ++i)
    if (!flights_[i].done && requests_[i].test()) completed(i, grads);
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::finish(T* grads) {
  monitor::timed exposed(figures_, &rank_figures::comm_exposed_s);
  detail::set_phase(fault_phase::gradient_allreduce, static_cast<std::int32_t>(buckets_.size()) - 1);
  // A rank without samples ran no backward: start every bucket but the last.
  if (buckets_.size() > 0 && started_ + 1 < buckets_.size()) start(buckets_.size() - 2, grads);
  if (started_ < buckets_.size()) {
    const std::size_t b = buckets_.size() - 1;
    const auto& last = buckets_[b];
    if (started_ == 0) first_start_ = exposed.start();
    account(last);
    const auto posted = clock::now();
    if (sharding() && compressing()) {
      post(b, grads).wait();
      unwire(b, grads);
    } else if (sharding()) {
      if constexpr (may_shard)
        comm_.reduce_scatter_v(grads + last.offset, shard_ + zero_.shard_at[b], zero_.counts_of(b), reduce_op::sum);
    } else if (compressing()) {
      if constexpr (may_compress) {
        on_wire([&]<class H>(H*) {
          H* w = wire<H>(grads, last);
          comm_.allreduce(w, last.count, reduce_op::sum);
          from_half(w, grads + last.offset, last.count);
        });
      }
    } else {
      comm_.allreduce(grads + last.offset, last.count, reduce_op::sum);
    }
    monitor::record_collective(static_cast<std::int32_t>(b), world(), double(last.count * wire_bytes()), posted,
                               clock::now());
    ++started_;
  }
  for (std::size_t i = 0; i < requests_.size(); ++i)
    if (!flights_[i].done) {
      requests_[i].wait();
      completed(i, grads);
    }
  exposed.stop();
  if (started_ > 0) figures_.comm_s += monitor::seconds_between(first_start_, clock::now());
  requests_.clear();
  flights_.clear();
  started_ = 0;
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::after_recovery() {
  requests_.clear();
  flights_.clear();
  gathers_.clear();
  gathers_done_ = 0;
  started_ = 0;
  if (sharding()) make_layout();
  if constexpr (may_compress) {  // abandoned requests may still write them: fresh ones next time
    wire_bf16_.abandon();
    wire_fp16_.abandon();
  }
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::sum(double* values, std::size_t n) {
  monitor::timed t(figures_, &rank_figures::wait_s);
  comm_.allreduce(values, n, reduce_op::sum);
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::start_gather_parameters(T* params)
  requires may_shard
{
  settle();
  detail::set_phase(fault_phase::gradient_allreduce, -1);
  const std::size_t n = static_cast<std::size_t>(world());
  // In the order the forward needs them (zero_layout::gather_unit).
  for (std::size_t u = 0; u < zero_.units.size(); ++u) {
    const auto& g = zero_.units[u];
    gathers_.push_back({comm_.iallgather_v(params + g.offset, zero_.unit_counts_of(u)), u, clock::now()});
    const double bus = n > 1 ? double(n - 1) / double(n) * double(g.count * sizeof(T)) : 0.0;
    figures_.bytes_sent += bus;
    figures_.bus_bytes += bus;
    figures_.comm_bytes += n > 1 ? double(g.count * sizeof(T)) : 0.0;
  }
  gathers_done_ = 0;
  if (!overlap_gather_) settle();
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::await_layer(std::size_t layer) {
  if (gathers_.empty()) return;
  if (layer >= zero_.layer_unit.size()) return settle();  // no map of the layers: all of them first
  const std::size_t u = zero_.layer_unit[layer];
  if (u >= gathers_.size()) return;  // a layer without parameters
  complete_gathers(u + 1);
  // Let MPI move the next one while this layer computes.
  if (gathers_done_ < gathers_.size() && gathers_[gathers_done_].request.test()) complete_gathers(gathers_done_ + 1);
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::settle() {
  if (!gathers_.empty()) complete_gathers(gathers_.size());
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::complete_gathers(std::size_t upto) {
  if (upto <= gathers_done_) return;
  {
    monitor::timed exposed(figures_, &rank_figures::comm_exposed_s);
    for (; gathers_done_ < upto; ++gathers_done_) {
      gather& g = gathers_[gathers_done_];
      g.request.wait();  // a no-op when test() saw it complete
      monitor::record_collective(static_cast<std::int32_t>(g.unit), world(), double(zero_.units[g.unit].count * sizeof(T)),
                                 g.posted, clock::now());
    }
  }
  if (gathers_done_ == gathers_.size()) {
    // From the first start to the last completion: the gathers' communication time, hidden
    // or not.
    figures_.comm_s += monitor::seconds_between(gathers_.front().posted, clock::now());
    gathers_.clear();
    gathers_done_ = 0;
  }
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::start(std::size_t b, T* grads) {
  // Buckets start strictly in plan order on every rank, so collectives match across ranks.
  while (started_ <= b) {
    const auto& bk = buckets_[started_];
    if (started_ == 0) first_start_ = clock::now();
    detail::fault_state.here.bucket = static_cast<std::int32_t>(started_);
    const auto posted = clock::now();
    requests_.push_back(post(started_, grads));
    flights_.push_back({static_cast<std::int32_t>(started_), posted});
    account(bk);
    ++started_;
  }
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
typename Comm::request bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::post(std::size_t b, T* grads) {
  const auto& bk = buckets_[b];
  if constexpr (may_shard) {
    if (sharding()) {
      if (compressing()) {
        if constexpr (may_compress) {
          return on_wire([&]<class H>(H*) {
            buffer<H, host_space>& ws = wire_buffer<H>(/*shard=*/true);
            if (ws.size() != std::max<std::size_t>(1, zero_.shard_count))
              ws = buffer<H, host_space>(std::max<std::size_t>(1, zero_.shard_count));
            return comm_.ireduce_scatter_v(wire<H>(grads, bk), ws.data() + zero_.shard_at[b], zero_.counts_of(b),
                                           reduce_op::sum);
          });
        }
      }
      return comm_.ireduce_scatter_v(grads + bk.offset, shard_ + zero_.shard_at[b], zero_.counts_of(b), reduce_op::sum);
    }
  }
  if constexpr (may_compress) {
    if (compressing())
      return on_wire([&]<class H>(H*) { return comm_.iallreduce(wire<H>(grads, bk), bk.count, reduce_op::sum); });
  }
  return comm_.iallreduce(grads + bk.offset, bk.count, reduce_op::sum);
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::unwire(std::size_t b, T* grads) {
  if constexpr (may_compress) {
    if (!compressing()) return;
    const auto& bk = buckets_[b];
    on_wire([&]<class H>(H*) {
      if constexpr (may_shard) {
        if (sharding()) {
          from_half(wire_buffer<H>(true).data() + zero_.shard_at[b], shard_ + zero_.shard_at[b], zero_.mine(b));
          return;
        }
      }
      from_half(wire_buffer<H>(false).data() + bk.offset, grads + bk.offset, bk.count);
    });
  }
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::make_layout() {
  if constexpr (may_shard)
    zero_ = zero_layout::make(buckets_, static_cast<std::size_t>(comm_.rank()), static_cast<std::size_t>(comm_.size()),
                              layer_counts_);
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::account(const gradient_bucket& bk) {
  const std::size_t n = static_cast<std::size_t>(world());
  // An allreduce moves 2 (n - 1) / n of the bucket per rank; a reduce-scatter half of that.
  const double bus = n > 1 ? (sharding() ? 1.0 : 2.0) * double(n - 1) / double(n) * double(bk.count * wire_bytes()) : 0.0;
  figures_.bytes_sent += bus;
  figures_.bus_bytes += bus;
  figures_.comm_bytes += n > 1 ? double(bk.count * wire_bytes()) : 0.0;
}

template <class T, class Comm, class Wire, bool AtRunTime, bool Sharded>
void bucket_allreduce<T, Comm, Wire, AtRunTime, Sharded>::completed(std::size_t i, T* grads) {
  flights_[i].done = true;
  const auto& bk = buckets_[static_cast<std::size_t>(flights_[i].bucket)];
  unwire(static_cast<std::size_t>(flights_[i].bucket), grads);
  monitor::record_collective(flights_[i].bucket, world(), double(bk.count * wire_bytes()), flights_[i].posted, clock::now());
}


}  // namespace detail

/// The gradient communication of data parallelism: checks that every rank runs the same job,
/// broadcasts rank 0's parameters, starts each bucket's allreduce as backward finishes its
/// layers, and waits for all of them before the optimizer steps. loom::replica_engine drives it
/// under data_parallel; the tensor-parallel grid and the pipeline engine use it for the
/// gradient average over replicas under loom::hybrid.
///
/// The wire format (compress<>) and ZeRO (shard_optimizer_state) are Policy's; under the
/// trainer's shared code (choose_at_run_time) they are the constructor's
/// data_parallel_choice instead, and the code of every choice is compiled in.
template <class Network, class T, class Policy>
class gradient_allreduce
    : public detail::bucket_allreduce<T, typename Policy::comm_type, typename Policy::wire_type,
                                      Policy::chooses_at_run_time, detail::shards_state_of_v<Policy>> {
  using base = detail::bucket_allreduce<T, typename Policy::comm_type, typename Policy::wire_type,
                                        Policy::chooses_at_run_time, detail::shards_state_of_v<Policy>>;
  using plan = bucket_plan<Network, T, Policy::bucket_cap_bytes>;

 public:
  using rank_network = Network;

  /// Over comm; the wire format and ZeRO are Policy's, or under a run-time choice `choice`'s.
  explicit gradient_allreduce(typename Policy::comm_type comm, data_parallel_choice choice = {})
      : base(std::move(comm), Policy::chooses_at_run_time ? choice : detail::data_parallel_choice_of<Policy>(),
             plan::buckets, plan::starts_after_layer, Network::parameter_counts, Network::parameter_count) {}

  /// Every rank holds the whole model, as replica rank(); its blocks at compile time.
  template <std::size_t = 0>
  static constexpr auto pieces_of = shards::whole<Network>;
  shard_map shard() const {
    return {.replica = this->rank(), .replicas = this->world(), .whole_count = Network::parameter_count,
            .local_count = Network::parameter_count, .pieces = shards::whole<Network>};
  }

  static constexpr const auto& buckets() { return plan::buckets; }
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/parallel/data/impl/data_parallel.ipp"
#endif
#include "loom/comm/impl/data_parallel_mpi.hpp"
