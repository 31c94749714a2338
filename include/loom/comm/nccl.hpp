// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::nccl_comm: the communicator between GPUs of processes started by mpirun, one GPU per
// rank. NCCL moves device memory; an mpi_comm underneath bootstraps it (rank 0 makes the
// ncclUniqueId and broadcasts it) and carries the operations on host memory (job checks, loss
// sums), so data_parallel<nccl_comm> works unchanged. Device operations run on the
// communicator's own stream, ordered after the caller's compute stream by an event; a request
// is a CUDA event recorded after the operation. Host code (no nvcc needed); needs the
// loom::nccl component.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/backend/cuda/runtime.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/core/error.hpp"

namespace loom {

namespace detail {

[[noreturn]] inline void throw_nccl(const char* op, int rank, const std::string& cause) {
  throw communication_error(std::string("loom::nccl_comm::") + op + ": rank " + std::to_string(rank) + ": " + cause);
}

inline void check_nccl(ncclResult_t r, ncclComm_t comm, const char* op, int rank) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string cause = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) cause += std::string(" (") + last + ")";
  throw_nccl(op, rank, cause);
}

inline void check_cuda_for_nccl(cudaError_t e, const char* what, const char* op, int rank) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw_nccl(op, rank, std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// Runs f, reporting a CUDA failure in it (an event, a stream) as the communication_error of op.
template <class F>
decltype(auto) cuda_for_nccl(const char* op, int rank, F&& f) {
  try {
    return f();
  } catch (const backend_error& e) {
    throw_nccl(op, rank, e.what());
  }
}

/// NCCL's element type for T, or nullopt (16-bit integers, long double) — such values move
/// through host memory (MPI) only.
template <class T>
constexpr std::optional<ncclDataType_t> nccl_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bf16>) return ncclBfloat16;  // NCCL sums 16-bit floats in float at each step
  else if constexpr (std::is_same_v<U, fp16>) return ncclFloat16;
  else if constexpr (std::is_floating_point_v<U>) {
    if constexpr (sizeof(U) == 4) return ncclFloat32;
    else if constexpr (sizeof(U) == 8) return ncclFloat64;
    else return std::nullopt;
  } else if constexpr (std::is_signed_v<U>) {
    if constexpr (sizeof(U) == 1) return ncclInt8;
    else if constexpr (sizeof(U) == 4) return ncclInt32;
    else if constexpr (sizeof(U) == 8) return ncclInt64;
    else return std::nullopt;
  } else {
    if constexpr (sizeof(U) == 1) return ncclUint8;
    else if constexpr (sizeof(U) == 4) return ncclUint32;
    else if constexpr (sizeof(U) == 8) return ncclUint64;
    else return std::nullopt;
  }
}

inline ncclRedOp_t nccl_op(reduce_op op) noexcept { return op == reduce_op::sum ? ncclSum : ncclMax; }

/// Whether p is GPU memory (device or managed) that NCCL can move; host memory, pinned or not,
/// goes through MPI.
inline bool on_device(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/// This process's index among the ranks of `comm` on its host: from the launcher
/// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID) for the world, else by
/// splitting comm into shared-memory groups.
inline int local_rank_of(const mpi_comm& comm) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (comm.size() == world)
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (const char* v = std::getenv(name); v && *v) {
        char* end = nullptr;
        const long r = std::strtol(v, &end, 10);
        if (end && *end == '\0' && r >= 0 && r < 1 << 20) return static_cast<int>(r);
      }
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm.native(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node),
            "nccl_comm (finding the local rank)", comm.rank());
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

/// What the copies of one nccl_comm share: the NCCL communicator, its device and stream, and
/// the point-to-point operations posted but not yet started.
struct nccl_state {
  struct p2p {
    bool send;
    void* data;
    std::size_t count;
    ncclDataType_t type;
    int peer;
    std::shared_ptr<std::shared_ptr<cuda_event>> done;  // filled when the group starts
  };

  ncclComm_t comm = nullptr;
  int device = 0;
  int rank = 0;
  cudaStream_t stream = nullptr;
  std::vector<p2p> queued;
  // Failure detection (nccl_comm::watch_for_failures): the host communicator's detector, whose
  // deadline and control communicator every wait also watches; set once a wait failed.
  std::shared_ptr<mpi_watch> watch;
  bool broken = false;

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;
  ~nccl_state() {
    int current = 0;
    const bool have = cudaGetDevice(&current) == cudaSuccess;
    (void)cudaSetDevice(device);
    if (stream) (void)cudaStreamSynchronize(stream);
    if (comm) (void)ncclCommDestroy(comm);
    if (stream) (void)cudaStreamDestroy(stream);
    if (have) (void)cudaSetDevice(current);
  }

  /// Starts every queued point-to-point operation as one NCCL group (so that pairs of sends
  /// and receives between two ranks cannot wait on each other), after the caller's work.
  void flush(const char* op) {
    if (queued.empty()) return;
    cuda_for_nccl(op, rank, [&] {
      cuda_event ready;
      ready.record(cuda_compute_stream());
      ready.make_wait(stream);
    });
    check_nccl(ncclGroupStart(), comm, op, rank);
    for (const p2p& q : queued) {
      if (q.send)
        check_nccl(ncclSend(q.data, q.count, q.type, q.peer, comm, stream), comm, op, rank);
      else
        check_nccl(ncclRecv(q.data, q.count, q.type, q.peer, comm, stream), comm, op, rank);
    }
    check_nccl(ncclGroupEnd(), comm, op, rank);
    auto done = cuda_for_nccl(op, rank, [&] {
      auto e = std::make_shared<cuda_event>();
      e->record(stream);
      return e;
    });
    for (p2p& q : queued) *q.done = done;
    queued.clear();
  }

  /// Blocks until `e` is reached, watching for NCCL's asynchronous errors (a failed peer)
  /// instead of hanging on them.
  void wait_for(const cuda_event& e, const char* op) const {
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned spins = 0; !cuda_for_nccl(op, rank, [&] { return e.done(); }); ++spins) {
      if (watch && spins % 16 == 0) watch_failures(op, t0);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm, &async), comm, op, rank);
      if (async != ncclSuccess && async != ncclInProgress) {
        (void)ncclCommAbort(comm);
        const_cast<nccl_state*>(this)->comm = nullptr;
        throw_nccl(op, rank, std::string("NCCL failed while waiting: ") + ncclGetErrorString(async) +
                                 "; the communicator is aborted");
      }
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  /// Under failure detection: the deadline, and a peer's recovery message on the control
  /// communicator. Throws loom::rank_failure (the operations in flight are left to the
  /// recovery: ncclCommShrink with NCCL_SHRINK_ABORT, or ncclCommAbort).
  void watch_failures(const char* op, std::chrono::steady_clock::time_point t0) const {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto fail = [&](rank_failure::kind k, int peer, const std::string& why) {
      const_cast<nccl_state*>(this)->broken = true;
      throw rank_failure(k, op, waited, peer,
                         std::string("loom::nccl_comm::") + op + ": rank " + std::to_string(rank) + " (" +
                             to_string(fault_state.here) + "): " + why);
    };
    if (watch->ctl != MPI_COMM_NULL) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, recovery_tag, watch->ctl, &flag, &st);
      if (flag) fail(rank_failure::kind::peer_recovery, st.MPI_SOURCE, "rank " + std::to_string(st.MPI_SOURCE) + " started a recovery");
    }
    const double deadline = watch->deadline_s > 0 ? watch->deadline_s : fault_state.shared_deadline_s;
    if (deadline > 0 && waited > deadline)
      fail(rank_failure::kind::deadline, -1, "not finished within its deadline of " + std::to_string(deadline) + " s");
  }
};

}  // namespace detail

/// A communicator over NCCL for GPU memory, one GPU per rank, with an mpi_comm beside it for
/// host memory. See loom::communicator for the operations; every rank must pass the same kind
/// of memory (device or host) to a collective. Device operations are queued on the
/// communicator's stream after the work the calling thread queued before them on its compute
/// stream; blocking calls return once the result is in place, requests complete when it is.
///
/// Point to point on device memory: isend / irecv are posted and start together, as one NCCL
/// group, at the next wait(), test(), blocking call or collective, so that a pair of ranks
/// exchanging messages cannot block each other. NCCL carries neither tags nor counts: messages
/// between two ranks arrive in the order they were posted whatever their tags, and a receive
/// must name the count that was sent (it is not checked, unlike mpi_comm's).
///
/// Failures throw communication_error("loom::nccl_comm::<operation>: rank R: <cause>").
class nccl_comm {
 public:
  class request;
  /// GPU memory goes through NCCL (what loom::trainer checks under data_parallel with loom::cuda).
  static constexpr bool moves_device_memory = true;

  /// Collective over `host`: picks this rank's GPU by its local rank on the host (local rank
  /// L uses device L), makes it the calling thread's device, and creates the NCCL communicator
  /// (rank 0 makes the unique id and broadcasts it over `host`).
  /// Throws: communication_error when a host has more ranks than GPUs, or NCCL fails.
  explicit nccl_comm(mpi_comm host) : nccl_comm(host, pick_device(host)) {}

  /// The same with an explicit device for this rank (each rank of a host a different one).
  nccl_comm(mpi_comm host, int device) : host_(std::move(host)), state_(std::make_shared<detail::nccl_state>()) {
    state_->rank = host_.rank();
    state_->device = device;
    detail::check_cuda_for_nccl(cudaSetDevice(device), "cudaSetDevice", "nccl_comm", host_.rank());
    ncclUniqueId id{};
    if (host_.rank() == 0) detail::check_nccl(ncclGetUniqueId(&id), nullptr, "nccl_comm", 0);
    host_.broadcast(reinterpret_cast<char*>(&id), sizeof(id), 0);
    detail::check_nccl(ncclCommInitRank(&state_->comm, host_.size(), id, host_.rank()), nullptr, "nccl_comm",
                       host_.rank());
    detail::check_cuda_for_nccl(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate",
                                "nccl_comm", host_.rank());
  }

  /// Every process of the job (MPI_COMM_WORLD), one GPU each.
  static nccl_comm world() { return nccl_comm(mpi_comm::world()); }

  int rank() const noexcept { return host_.rank(); }
  int size() const noexcept { return host_.size(); }
  /// "nccl".
  std::string name() const { return "nccl"; }
  /// The GPU of this rank.
  int device() const noexcept { return state_->device; }
  /// The stream NCCL operations run on.
  cudaStream_t stream() const noexcept { return state_->stream; }
  /// The MPI communicator beside it (host memory).
  mpi_comm& host() noexcept { return host_; }

  /// Failure detection on both sides (see mpi_comm::watch_for_failures): the host
  /// communicator's detector, whose deadline every wait for a GPU operation also keeps.
  /// Collective.
  void watch_for_failures(double deadline_s) {
    host_.watch_for_failures(deadline_s);
    state_->watch = host_.watch_shared();
  }
  void set_deadline(double deadline_s) noexcept { host_.set_deadline(deadline_s); }
  detail::mpi_watch* watch() const noexcept { return host_.watch(); }

  /// The recovery protocol of loom/comm/mpi_recovery.hpp on the host communicator, then the
  /// GPU side over the survivors: ncclCommShrink of the old communicator with
  /// NCCL_SHRINK_ABORT (which ends its operations in flight) where NCCL >= 2.27, else
  /// ncclCommAbort and a new communicator from a unique id broadcast over the survivors' MPI
  /// communicator. Collective over the survivors. Compiled here; run only where a GPU is lent.
  friend recovery_result recover_world(nccl_comm& c, const recovery_request& q) {
    recovery_result res = recover_world(c.host_, q);
    if (res.excluded || !q.rebuild) return res;
    const std::shared_ptr<detail::nccl_state> old = c.state_;
    auto fresh = std::make_shared<detail::nccl_state>();
    fresh->rank = c.host_.rank();
    fresh->device = old->device;
    detail::check_cuda_for_nccl(cudaSetDevice(fresh->device), "cudaSetDevice", "recover_world", fresh->rank);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    std::vector<int> lost = res.lost;
    detail::check_nccl(ncclCommShrink(old->comm, lost.data(), static_cast<int>(lost.size()), &fresh->comm, nullptr,
                                      NCCL_SHRINK_ABORT),
                       old->comm, "recover_world", fresh->rank);
    (void)ncclCommAbort(old->comm);
#else
    (void)ncclCommAbort(old->comm);
    ncclUniqueId id{};
    if (c.host_.rank() == 0) detail::check_nccl(ncclGetUniqueId(&id), nullptr, "recover_world", 0);
    c.host_.broadcast(reinterpret_cast<char*>(&id), sizeof(id), 0);
    detail::check_nccl(ncclCommInitRank(&fresh->comm, c.host_.size(), id, c.host_.rank()), nullptr, "recover_world",
                       fresh->rank);
#endif
    // The old stream may hold a kernel that never ends: left as it is, never synchronised.
    old->comm = nullptr;
    old->stream = nullptr;
    detail::check_cuda_for_nccl(cudaStreamCreateWithFlags(&fresh->stream, cudaStreamNonBlocking), "cudaStreamCreate",
                                "recover_world", fresh->rank);
    fresh->watch = c.host_.watch_shared();
    c.state_ = std::move(fresh);
    return res;
  }

  /// loom::fence_left_out over the host communicator (its peers are the processes).
  friend std::vector<long> fence_left_out(const nccl_comm& c, const recovery_result& res) {
    return fence_left_out(c.host_, res);
  }

  /// Collective: the ranks passing the same colour (>= 0) form a new communicator, ranked by
  /// (key, old rank): MPI_Comm_split for the host side, ncclCommSplit for the GPU side.
  nccl_comm split(int colour, int key) {
    if (colour < 0)
      detail::throw_nccl("split", rank(), "colour " + std::to_string(colour) + " is negative; colours must be >= 0");
    mpi_comm part = host_.split(colour, key);
    flush("split");
    return nccl_comm(std::move(part), state_, colour, key);
  }

  /// Returns once every rank has entered the barrier (MPI).
  void barrier() { host_.barrier(); }

  template <detail::comm_value T>
  void broadcast(T* data, std::size_t count, int root) {
    if (!device_memory(data)) return host_.broadcast(data, count, root);
    check_root("broadcast", root);
    run("broadcast", [&](cudaStream_t s) {
      return ncclBroadcast(data, data, count, type_of<T>("broadcast"), root, state_->comm, s);
    }).synchronize_for(*state_, "broadcast");
  }

  template <detail::comm_reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    if (!device_memory(data)) return host_.allreduce(data, count, op);
    run("allreduce", [&](cudaStream_t s) {
      return ncclAllReduce(data, data, count, type_of<T>("allreduce"), detail::nccl_op(op), state_->comm, s);
    }).synchronize_for(*state_, "allreduce");
  }

  template <detail::comm_reducible T>
  void reduce_scatter(const T* in, T* out, std::size_t count, reduce_op op) {
    if (!same_kind("reduce_scatter", in, out)) return host_.reduce_scatter(in, out, count, op);
    run("reduce_scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(in, out, count, type_of<T>("reduce_scatter"), detail::nccl_op(op), state_->comm, s);
    }).synchronize_for(*state_, "reduce_scatter");
  }

  template <detail::comm_value T>
  void allgather(const T* in, T* out, std::size_t count) {
    if (!same_kind("allgather", in, out)) return host_.allgather(in, out, count);
    run("allgather", [&](cudaStream_t s) {
      return ncclAllGather(in, out, count, type_of<T>("allgather"), state_->comm, s);
    }).synchronize_for(*state_, "allgather");
  }

  template <detail::comm_value T>
  void send(const T* data, std::size_t count, int peer, int tag) {
    if (!device_memory(data)) return host_.send(data, count, peer, tag);
    isend(data, count, peer, tag).wait();
  }

  template <detail::comm_value T>
  void recv(T* data, std::size_t count, int peer, int tag) {
    if (!device_memory(data)) return host_.recv(data, count, peer, tag);
    irecv(data, count, peer, tag).wait();
  }

  template <detail::comm_reducible T>
  [[nodiscard]] request iallreduce(T* data, std::size_t count, reduce_op op);
  template <detail::comm_value T>
  [[nodiscard]] request isend(const T* data, std::size_t count, int peer, int tag);
  template <detail::comm_value T>
  [[nodiscard]] request irecv(T* data, std::size_t count, int peer, int tag);
  /// See mpi_comm::ireduce_scatter_v. In device memory: one NCCL group of ncclReduce calls,
  /// block j to rank j (NCCL's own reduce-scatter takes equal blocks only).
  template <detail::comm_reducible T>
  [[nodiscard]] request ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op);
  /// See mpi_comm::iallgather_v. In device memory: one NCCL group of ncclBroadcast calls,
  /// block j from rank j.
  template <detail::comm_value T>
  [[nodiscard]] request iallgather_v(T* data, const std::size_t* counts);
  /// The same, blocking (host memory: mpi_comm's blocking ones).
  template <detail::comm_reducible T>
  void reduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
    if (!same_kind("reduce_scatter_v", in, out)) return host_.reduce_scatter_v(in, out, counts, op);
    ireduce_scatter_v(in, out, counts, op).wait();
  }
  template <detail::comm_value T>
  void allgather_v(T* data, const std::size_t* counts) {
    if (!device_memory(data)) return host_.allgather_v(data, counts);
    iallgather_v(data, counts).wait();
  }

 private:
  struct started {
    cuda_event done;
    void synchronize_for(const detail::nccl_state& s, const char* op) const { s.wait_for(done, op); }
  };

  // The communicator of a split: ncclCommSplit from the parent's state.
  nccl_comm(mpi_comm host, const std::shared_ptr<detail::nccl_state>& parent, int colour, int key)
      : host_(std::move(host)), state_(std::make_shared<detail::nccl_state>()) {
    state_->rank = host_.rank();
    state_->device = parent->device;
    detail::check_nccl(ncclCommSplit(parent->comm, colour, key, &state_->comm, nullptr), parent->comm, "split",
                       parent->rank);
    detail::check_cuda_for_nccl(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate",
                                "split", host_.rank());
  }

  static int pick_device(const mpi_comm& host) {
    const int local = detail::local_rank_of(host);
    const int n = cuda_device_count();
    if (local >= n)
      detail::throw_nccl("nccl_comm", host.rank(),
                         "this rank is local rank " + std::to_string(local) + " on its host, which has " +
                             std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") +
                             ": start at most one rank per GPU on each host");
    return local;
  }

  template <class T>
  ncclDataType_t type_of(const char* op) const {
    constexpr auto t = detail::nccl_type<T>();
    if constexpr (!t.has_value()) {
      detail::throw_nccl(op, rank(), "NCCL cannot move elements of " + std::to_string(sizeof(T)) +
                                         " bytes of this type; keep them in host memory (MPI)");
    } else {
      return *t;
    }
  }

  bool device_memory(const void* p) const {
    if (!detail::on_device(p)) return false;
    int current = -1;
    (void)cudaGetDevice(&current);
    if (current != state_->device)
      detail::throw_nccl("(device operation)", rank(),
                         "the calling thread computes on device " + std::to_string(current) +
                             " but this communicator's GPU is device " + std::to_string(state_->device));
    return true;
  }

  bool same_kind(const char* op, const void* in, const void* out) const {
    const bool a = device_memory(in), b = device_memory(out);
    if (a != b) detail::throw_nccl(op, rank(), "one buffer is GPU memory and the other host memory; give two of one kind");
    return a;
  }

  void check_root(const char* op, int root) const {
    if (root < 0 || root >= size())
      detail::throw_nccl(op, rank(), "root " + std::to_string(root) + " is not a rank of this communicator of " +
                                         std::to_string(size()));
  }

  void check_peer(const char* op, int peer) const {
    if (peer < 0 || peer >= size())
      detail::throw_nccl(op, rank(), "peer " + std::to_string(peer) + " is not a rank of this communicator of " +
                                         std::to_string(size()));
  }

  void flush(const char* op) { state_->flush(op); }

  /// Queues call(stream) on the communicator's stream after the caller's compute-stream work
  /// (and after point-to-point operations posted before it); returns the completion event.
  template <class Call>
  started run(const char* op, Call&& call) {
    flush(op);
    detail::cuda_for_nccl(op, rank(), [&] {
      cuda_event ready;
      ready.record(cuda_compute_stream());
      ready.make_wait(state_->stream);
    });
    detail::check_nccl(call(state_->stream), state_->comm, op, rank());
    return detail::cuda_for_nccl(op, rank(), [&] {
      started s;
      s.done.record(state_->stream);
      return s;
    });
  }

  template <class T>
  request post_p2p(const char* op, bool send, T* data, std::size_t count, int peer);

  mpi_comm host_;
  std::shared_ptr<detail::nccl_state> state_;
};

/// A pending nccl_comm operation: a CUDA event after the NCCL call (device memory), or an
/// mpi_comm request (host memory). wait() blocks until it completes, test() says whether it
/// has; both start queued point-to-point operations first. A request destroyed while pending
/// waits in its destructor; an error there is printed to stderr.
class nccl_comm::request {
 public:
  request() = default;
  request(request&&) noexcept = default;
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      finish();
      state_ = std::move(o.state_);
      done_ = std::move(o.done_);
      host_ = std::move(o.host_);
      op_ = o.op_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish(); }

  /// Blocks until the operation has completed. Throws communication_error.
  void wait() {
    host_.wait();
    if (!state_) return;
    auto state = std::move(state_);
    if (!*done_) state->flush(op_);
    state->wait_for(**done_, op_);
    done_.reset();
  }

  /// True once the operation has completed. Throws communication_error.
  bool test() {
    if (!host_.test()) return false;
    if (!state_) return true;
    if (!*done_) state_->flush(op_);
    if (!detail::cuda_for_nccl(op_, state_->rank, [&] { return (*done_)->done(); })) return false;
    state_.reset();
    done_.reset();
    return true;
  }

 private:
  friend class nccl_comm;

  void finish() noexcept {
    if (state_ && state_->broken) {  // abandoned: a failure broke its communicator
      state_.reset();
      done_.reset();
      return;
    }
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: nccl_comm: %s (in a request's destructor)\n", e.what());
    }
  }

  std::shared_ptr<detail::nccl_state> state_;
  std::shared_ptr<std::shared_ptr<cuda_event>> done_;  // the event, once the operation has started
  mpi_comm::request host_;
  const char* op_ = "";
};

template <detail::comm_reducible T>
nccl_comm::request nccl_comm::iallreduce(T* data, std::size_t count, reduce_op op) {
  request r;
  r.op_ = "iallreduce";
  if (!device_memory(data)) {
    r.host_ = host_.iallreduce(data, count, op);
    return r;
  }
  started s = run("iallreduce", [&](cudaStream_t st) {
    return ncclAllReduce(data, data, count, type_of<T>("iallreduce"), detail::nccl_op(op), state_->comm, st);
  });
  r.state_ = state_;
  r.done_ = std::make_shared<std::shared_ptr<cuda_event>>(std::make_shared<cuda_event>(std::move(s.done)));
  return r;
}

template <class T>
nccl_comm::request nccl_comm::post_p2p(const char* op, bool send, T* data, std::size_t count, int peer) {
  check_peer(op, peer);
  request r;
  r.op_ = op;
  r.state_ = state_;
  r.done_ = std::make_shared<std::shared_ptr<cuda_event>>();
  state_->queued.push_back({send, const_cast<std::remove_const_t<T>*>(data), count, type_of<std::remove_const_t<T>>(op),
                            peer, r.done_});
  return r;
}

template <detail::comm_value T>
nccl_comm::request nccl_comm::isend(const T* data, std::size_t count, int peer, int tag) {
  if (!device_memory(data)) {
    request r;
    r.op_ = "isend";
    r.host_ = host_.isend(data, count, peer, tag);
    return r;
  }
  return post_p2p("isend", true, data, count, peer);
}

template <detail::comm_value T>
nccl_comm::request nccl_comm::irecv(T* data, std::size_t count, int peer, int tag) {
  if (!device_memory(data)) {
    request r;
    r.op_ = "irecv";
    r.host_ = host_.irecv(data, count, peer, tag);
    return r;
  }
  return post_p2p("irecv", false, data, count, peer);
}

template <detail::comm_reducible T>
nccl_comm::request nccl_comm::ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
  request r;
  r.op_ = "ireduce_scatter_v";
  if (!same_kind("ireduce_scatter_v", in, out)) {
    r.host_ = host_.ireduce_scatter_v(in, out, counts, op);
    return r;
  }
  started s = run("ireduce_scatter_v", [&](cudaStream_t st) {
    ncclResult_t rc = ncclGroupStart();
    std::size_t at = 0;
    for (int j = 0; j < size() && rc == ncclSuccess; ++j) {
      const std::size_t n = counts[static_cast<std::size_t>(j)];
      rc = ncclReduce(in + at, j == rank() ? out : const_cast<T*>(in + at), n, type_of<T>("ireduce_scatter_v"),
                      detail::nccl_op(op), j, state_->comm, st);
      at += n;
    }
    const ncclResult_t end = ncclGroupEnd();
    return rc != ncclSuccess ? rc : end;
  });
  r.state_ = state_;
  r.done_ = std::make_shared<std::shared_ptr<cuda_event>>(std::make_shared<cuda_event>(std::move(s.done)));
  return r;
}

template <detail::comm_value T>
nccl_comm::request nccl_comm::iallgather_v(T* data, const std::size_t* counts) {
  request r;
  r.op_ = "iallgather_v";
  if (!device_memory(data)) {
    r.host_ = host_.iallgather_v(data, counts);
    return r;
  }
  started s = run("iallgather_v", [&](cudaStream_t st) {
    ncclResult_t rc = ncclGroupStart();
    std::size_t at = 0;
    for (int j = 0; j < size() && rc == ncclSuccess; ++j) {
      const std::size_t n = counts[static_cast<std::size_t>(j)];
      rc = ncclBroadcast(data + at, data + at, n, type_of<T>("iallgather_v"), j, state_->comm, st);
      at += n;
    }
    const ncclResult_t end = ncclGroupEnd();
    return rc != ncclSuccess ? rc : end;
  });
  r.state_ = state_;
  r.done_ = std::make_shared<std::shared_ptr<cuda_event>>(std::make_shared<cuda_event>(std::move(s.done)));
  return r;
}

static_assert(communicator<nccl_comm>);

}  // namespace loom
