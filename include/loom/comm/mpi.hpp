// SPDX-License-Identifier: Apache-2.0
#pragma once
#define LOOM_COMM_MPI_HPP 1
// loom::mpi::environment and loom::mpi_comm: the communicator between processes started by
// mpirun (Open MPI); a program started without mpirun runs as one rank. Boost.MPI provides the
// environment and owns the communicator handles; the calls themselves are raw MPI, because
// Boost.MPI 1.74 asserts (aborts) on an MPI error in builds without NDEBUG instead of throwing.
// This header names Boost.MPI's types only as declarations: its headers (16,000 lines) are
// included where the definitions are (impl/mpi.ipp: header-only, or src/loom_mpi.cpp under
// separate compilation), so that a program compiled against loom::compiled_mpi does not parse
// them. Needs the loom::mpi component.

// MPI's C API only: Open MPI's deprecated C++ bindings (mpicxx.h, removed in MPI 3) would
// otherwise come with <mpi.h> and add thousands of lines and out-of-line functions to every
// program. (Boost.MPI's headers skip them the same way.)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/mpi_recovery.hpp"
#include "loom/comm/open_mpi.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/half.hpp"

namespace boost::mpi {
class communicator;
class environment;
}  // namespace boost::mpi

namespace loom {

namespace detail {

/// MPI's text for an error code ("MPI_ERR_TAG: invalid tag").
LOOM_MPI_DECL std::string mpi_error_string(int code);

[[noreturn]] inline void throw_mpi(const char* op, int rank, const std::string& cause) {
  throw communication_error(std::string("loom::mpi_comm::") + op + ": rank " + std::to_string(rank) + ": " + cause);
}

inline void check_mpi(int code, const char* op, int rank) {
  if (code != MPI_SUCCESS) throw_mpi(op, rank, mpi_error_string(code));
}

/// Whether MPI error code says the call's arguments were wrong (its class: a buffer, count,
/// type, tag, communicator, rank, root, group, operation or other argument), rather than that
/// the communication failed.
inline bool mpi_argument_error(int code) {
  int c = code;
  if (MPI_Error_class(code, &c) != MPI_SUCCESS) return false;
  return c == MPI_ERR_BUFFER || c == MPI_ERR_COUNT || c == MPI_ERR_TYPE || c == MPI_ERR_TAG || c == MPI_ERR_COMM ||
         c == MPI_ERR_RANK || c == MPI_ERR_ROOT || c == MPI_ERR_GROUP || c == MPI_ERR_OP || c == MPI_ERR_ARG;
}

/// The MPI datatype of a communicator element (detail::comm_value): MPI's own for each
/// arithmetic type, MPI_UINT16_T for loom::bf16 and loom::fp16 (reduced by the ops below).
template <class T>
MPI_Datatype mpi_datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (is_half_v<U>) return MPI_UINT16_T;
  else if constexpr (std::is_same_v<U, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, long double>) return MPI_LONG_DOUBLE;
  else if constexpr (std::is_same_v<U, char>) return MPI_CHAR;
  else if constexpr (std::is_same_v<U, signed char>) return MPI_SIGNED_CHAR;
  else if constexpr (std::is_same_v<U, unsigned char>) return MPI_UNSIGNED_CHAR;
  else if constexpr (std::is_same_v<U, wchar_t>) return MPI_WCHAR;
  else if constexpr (std::is_same_v<U, short>) return MPI_SHORT;
  else if constexpr (std::is_same_v<U, unsigned short>) return MPI_UNSIGNED_SHORT;
  else if constexpr (std::is_same_v<U, int>) return MPI_INT;
  else if constexpr (std::is_same_v<U, unsigned>) return MPI_UNSIGNED;
  else if constexpr (std::is_same_v<U, long>) return MPI_LONG;
  else if constexpr (std::is_same_v<U, unsigned long>) return MPI_UNSIGNED_LONG;
  else if constexpr (std::is_same_v<U, long long>) return MPI_LONG_LONG;
  else if constexpr (std::is_same_v<U, unsigned long long>) return MPI_UNSIGNED_LONG_LONG;
  else if constexpr (sizeof(U) == 1) return MPI_UINT8_T;  // char8_t
  else if constexpr (sizeof(U) == 2) return MPI_UINT16_T;  // char16_t
  else return MPI_UINT32_T;                                // char32_t
}

/// MPI's reduction of 16-bit floats (loom::bf16, loom::fp16): each pair converted to float,
/// combined there and rounded back — a sum in float at every step, 16 bits on the wire. MPI has
/// no such types (MPI 4.0 has no bfloat16 at all), so they travel as MPI_UINT16_T with these
/// user operations (commutative: the ring and tree algorithms may reorder).
template <class H, bool Sum>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const H* a = static_cast<const H*>(in);
  H* b = static_cast<H*>(inout);
  if constexpr (Sum) add_half(a, b, static_cast<std::size_t>(*len));
  else
    for (int i = 0; i < *len; ++i) b[i] = b[i] < a[i] ? a[i] : b[i];
}
template <class H>
MPI_Op half_op(reduce_op op) {
  static const MPI_Op sum = [] {
    MPI_Op o;
    check_mpi(MPI_Op_create(&half_reduce<H, true>, 1, &o), "MPI_Op_create", -1);
    return o;
  }();
  static const MPI_Op max = [] {
    MPI_Op o;
    check_mpi(MPI_Op_create(&half_reduce<H, false>, 1, &o), "MPI_Op_create", -1);
    return o;
  }();
  return op == reduce_op::sum ? sum : max;
}

template <class T = double>
MPI_Op mpi_op(reduce_op op) {
  if constexpr (is_half_v<T>) return half_op<std::remove_cv_t<T>>(op);
  else return op == reduce_op::sum ? MPI_SUM : MPI_MAX;
}

inline bool mpi_running() noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

/// The tag of the messages the survivors of a failure exchange on a watch's control
/// communicator (loom/comm/mpi_recovery.hpp).
inline constexpr int recovery_tag = 0x10f7;
/// The tag of MPI_Intercomm_create between the survivors and their replacements.
inline constexpr int replacement_tag = 0x10f9;
/// The world of a replacement process (the survivors and the newcomers merged; see
/// mpi::environment), MPI_COMM_NULL otherwise: mpi_comm::world() is then MPI_COMM_WORLD.
inline MPI_Comm joined_world = MPI_COMM_NULL;

/// Keeps Open MPI's TCP transport moving after peers died. That transport is driven by Open
/// MPI's event loop, which opal_progress polls on every call only while its count of "event
/// users" is positive, and otherwise once per tick (10 ms by default). Every connected TCP
/// endpoint adds one to the count and every close subtracts one — also the close of a connection
/// attempt that failed, which never added (Open MPI 4.1.4, opal/mca/btl/tcp/btl_tcp_endpoint.c,
/// mca_btl_tcp_endpoint_close). After a peer dies, the attempts to reach it again drive the count
/// to zero or below, and the survivors' TCP messages then move once per tick: measured on the
/// 2-host harness, host 0's two survivors trained at 588 samples/s (57% of each step exposed
/// communication) where the same run with the tick at 1 µs reaches 18 346; a replacement killed
/// in its turn made 3000 mlp steps take 198 s instead of 10 s. This sets the tick to
/// 1 µs, what a connected endpoint gets anyway, through Open MPI's exported
/// opal_progress_set_event_poll_rate (looked up at run time: nothing is linked against Open MPI's
/// internals). It costs messages over shared memory ~1.5 µs each (measured with
/// bench_allreduce: 4 KiB 1.2 → 2.7 µs, 1 MiB +5–8%), which is why only a survivor of a
/// failure (loom::recover_world, before its roll call) and a replacement (its peers are over TCP
/// anyway) do it. Does nothing when the user chose the tick (mpirun --mca mpi_event_tick_rate, i.e.
/// OMPI_MCA_mpi_event_tick_rate in the environment), under another MPI, or when the function is
/// not found. Returns whether it set the tick.
LOOM_MPI_DECL bool restore_event_polling_after_failure();
/// Makes a write to a connection whose peer died fail with EPIPE rather than end this process:
/// SIGPIPE becomes ignored, unless the program chose its own disposition for it (a handler, or
/// ignored already), which is left alone. Open MPI 4.1.4 keeps SIGPIPE's default action
/// (terminate) in MPI processes, and its TCP transport sends with writev(), which raises SIGPIPE
/// on a socket that the dead peer's kernel has reset: a survivor that sends to a dead peer before
/// its progress has read the reset dies with it, silently, with status 141 (128 + SIGPIPE). Seen
/// on the 2-host harness when host 1 is killed: host 0's rank 1, whose ring neighbour is on host
/// 1, died so in 3 of 60 runs (docs/fault-tolerance.md, "Open MPI and SIGPIPE"). With SIGPIPE
/// ignored, writev() returns EPIPE, Open MPI marks that connection failed, and the failure
/// detector handles the dead peer as any other. Called when failure detection starts
/// (mpi_comm::watch_for_failures, watch_deadlines_only), by mpi::environment when the runtime
/// keeps survivors (mpirun --enable-recovery), and in a replacement. Returns whether it changed
/// the disposition.
LOOM_MPI_DECL bool ignore_broken_pipes();

/// A peer of a watched communicator: its process and host, for the roll call and for fencing.
struct mpi_peer {
  int world_rank = 0;
  long pid = 0;
  std::string host;
};

/// Whether process pid (on this host) runs this very program: a left-out peer, not a stranger
/// that took a dead peer's pid.
LOOM_MPI_DECL bool runs_this_program(long pid);

/// What this host knows of a silent peer: gone (no such process, or a zombie), stopped
/// (SIGSTOP, a debugger), alive (running or sleeping), or unknown (on another host).
enum class local_evidence { unknown, gone, stopped, alive };
LOOM_MPI_DECL local_evidence evidence_of(const mpi_peer& p, const std::string& my_host);

/// The failure detector of a loom::mpi_comm (mpi_comm::watch_for_failures): every operation's
/// wait has a deadline; while waiting it also looks, about every millisecond, for a peer's
/// recovery message on a control communicator (a duplicate of the data communicator, used for
/// nothing else) and for SIGTERM. Whatever ends a wait early throws loom::rank_failure and
/// marks the communicator broken: its pending requests are abandoned, never waited for (their
/// buffers must not be reused for anything else: loom::model::renew_gradients).
class mpi_watch {
 public:
  using clock = std::chrono::steady_clock;
  MPI_Comm ctl = MPI_COMM_NULL;
  /// The membership epoch: 0 at the start, one more after each recovery.
  std::uint64_t generation = 0;
  bool broken = false;
  double deadline_s = 60;
  std::vector<mpi_peer> peers;  // by rank of the data communicator
  std::string job_id;           // the same on every rank: names the verdict directory
  /// The last operation that completed here, and where the trainer was then.
  const char* last_op = "none";
  fault_marker last_done{};
  /// The detector of the communicator this one's was split from (mpi_comm::watch_as_part_of),
  /// null when none: its deadline is this one's (deadline_s 0), its control communicator is
  /// the one looked at, its roll call reports this one's last operation, and a failure here
  /// breaks it too.
  std::shared_ptr<mpi_watch> whole;

  /// Waits for the n requests r (statuses into st, or MPI_STATUSES_IGNORE), at most
  /// deadline_s. Throws rank_failure.
  void wait(int n, MPI_Request* r, MPI_Status* st, const char* op, int rank);

  /// MPI refused to start operation op (its call returned code): under failure detection that
  /// is a dead peer's doing as much as an error in a wait — Open MPI 4.1's TCP transport, once a
  /// write to a dead peer's socket failed (EPIPE), refuses the next send to it with
  /// MPI_ERR_INTERN. Throws rank_failure (kind mpi_error) and marks the communicator broken, as
  /// a failed wait does.
  [[noreturn]] void refused(const char* op, int rank, int code) {
    fail(rank_failure::kind::mpi_error, op, rank, clock::now(), -1, "MPI refused to start it: " + mpi_error_string(code));
  }

 private:
  static fault_marker detail_here() noexcept { return fault_state.here; }
  [[noreturn]] void fail(rank_failure::kind k, const char* op, int rank, clock::time_point t0, int peer,
                         const std::string& why);
};

}  // namespace detail


namespace mpi {

/// MPI for the life of the program: construct one at the top of main, before any mpi_comm.
/// Initialises MPI with MPI_THREAD_FUNNELED (only the thread that constructed it calls MPI)
/// and sets MPI_ERRORS_RETURN on MPI_COMM_WORLD, so that failures become exceptions instead of
/// ending the job. Started without mpirun, the program is one rank (MPI singleton). If an
/// exception leaves main while it is alive, its destructor calls MPI_Abort, so the whole job
/// ends instead of leaving the other ranks waiting. Throws communication_error when MPI cannot
/// provide MPI_THREAD_FUNNELED.
class environment {
 public:
  environment(int& argc, char**& argv);
  environment();
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  /// Records "finished" for a launcher (detail::write_exit_status) unless the process already
  /// said how it ends.
  ~environment() {
    detail::write_exit_status(std::uncaught_exceptions() ? "failed (exception)" : "finished");
    if (detail::fault_state.recovered) {
      // MPI_Finalize's fence may include the dead and never end: give it two seconds.
      std::fflush(nullptr);
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        std::fflush(nullptr);
        std::_Exit(0);
      }).detach();
    }
  }

  /// The thread support MPI provides (MPI_Query_thread): MPI_THREAD_FUNNELED or more.
  int thread_level() const {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level;
  }
  /// The underlying Boost.MPI environment (include <boost/mpi/environment.hpp> to use it).
  const boost::mpi::environment& boost_environment() const noexcept;

 private:
  void set_up();

  /// A replacement of a lost rank (fault_options::replace): the survivors' rank 0 spawned this
  /// process (over MPI_COMM_SELF, see loom::spawn_replacements) and waits for it to merge.
  /// Joins that parent (merge: the parent 0, the newcomers after it), then the survivors
  /// (MPI_Intercomm_create with the parent as the bridge, merged with the survivors low), and
  /// makes the result mpi_comm::world(). The trainer then skips its start-up collectives and
  /// its first fit takes the survivors' state (detail::fault_state.joining_as_replacement).
  static void join_survivors(MPI_Comm parent);

  /// Open MPI's defaults that loom's communication is measured with, set before MPI starts
  /// unless the environment already sets them: libnbc's ring for MPI_Iallreduce (measured with
  /// Open MPI 4.1.4 on one host, 0.94 MB of floats: ring 237 us against the default choice's
  /// 438 us on 2 ranks, 552 against 829 on 4; a blocking MPI_Allreduce takes 272 and 710), which
  /// every gradient bucket and every collective under failure detection uses.
  struct mca_defaults {
    mca_defaults() { ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "ring", 0); }
  } mca_defaults_;
  std::shared_ptr<boost::mpi::environment> env_;  // made, and finally destroyed, where Boost.MPI is included
};

/// Prints "loom: rank R: message" to stderr and ends the whole job with exit code `code`
/// (MPI_Abort), so that a failing rank never leaves its peers waiting. Without MPI running,
/// prints "loom: message" and exits.
[[noreturn]] inline void abort(int code, const std::string& message) {
  if (detail::mpi_running()) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "loom: rank %d: %s\n", rank, message.c_str());
    std::fflush(stderr);
    detail::write_exit_status("failed " + std::to_string(code));
    MPI_Abort(MPI_COMM_WORLD, code);
  } else {
    std::fprintf(stderr, "loom: %s\n", message.c_str());
    std::fflush(stderr);
  }
  std::_Exit(code);
}

}  // namespace mpi

/// A communicator over MPI (a Boost.MPI communicator owns the MPI_Comm; the operations are
/// raw MPI calls, as fast as Boost.MPI's for built-in types). See loom::communicator for the
/// operations. Collectives match by order, as MPI's do: every rank calls the same ones in
/// the same order with the same count, root and operator (MPI does not check this).
///
/// Counts are std::size_t; MPI's are int, so a count above max_count() (INT_MAX unless set with
/// with_max_count) is split into chunks of at most max_count() elements, one MPI call each
/// (reduce_scatter and allgather then use one reduce / broadcast per rank and chunk).
/// Every rank must use the same max_count().
///
/// Only the thread that constructed loom::mpi::environment calls it (MPI_THREAD_FUNNELED).
/// Non-blocking operations progress inside MPI calls (Open MPI has no progress thread for
/// shared memory or TCP): call test() on a request now and then to keep it moving.
/// Failures throw communication_error("loom::mpi_comm::<operation>: rank R: <MPI's text>").
class mpi_comm {
 public:
  class request;

  /// Wraps a Boost.MPI communicator (shares it) and sets MPI_ERRORS_RETURN on it. Throws
  /// communication_error for a null communicator or when MPI is not running.
  explicit mpi_comm(const boost::mpi::communicator& comm);
  /// Wraps an MPI communicator: attached (the caller keeps it alive and frees it) or, with
  /// take_ownership, freed (MPI_Comm_free) when the last copy of this mpi_comm goes, as
  /// Boost.MPI's comm_attach and comm_take_ownership. Sets MPI_ERRORS_RETURN on it. Throws as
  /// the constructor.
  static mpi_comm attach(MPI_Comm comm, bool take_ownership = false);

  /// Every process of the job (MPI_COMM_WORLD; in a replacement of a lost rank, the world it
  /// joined: fault_options::replace). Throws communication_error when MPI is not
  /// running.
  /// The tag ireduce_scatter_v's messages carry on this communicator: user point-to-point
  /// messages must not use it.
  static constexpr int reduce_scatter_tag = 0x4c52;  // 'LR'

  static mpi_comm world() {
    if (!detail::mpi_running())
      throw communication_error("loom::mpi_comm::world: MPI is not running: construct a loom::mpi::environment first");
    if (detail::joined_world != MPI_COMM_NULL)  // a replacement of a lost rank: the survivors' world
      return attach(detail::joined_world);
    return attach(MPI_COMM_WORLD);
  }

  /// This process's index in the communicator, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// The number of processes in the communicator.
  int size() const noexcept { return size_; }
  /// "mpi".
  std::string name() const { return "mpi"; }
  /// The MPI communicator, for raw MPI calls.
  MPI_Comm native() const noexcept { return comm_; }
  /// The Boost.MPI communicator that owns it (include <boost/mpi/communicator.hpp> to use it).
  const boost::mpi::communicator& boost_communicator() const noexcept;

  /// The most elements one MPI call carries (INT_MAX unless set with with_max_count).
  std::size_t max_count() const noexcept { return max_count_; }

  /// The same communicator with counts above `max_count` elements split into chunks; for
  /// testing the chunked path without 8 GiB buffers. Requires 1 <= max_count <= INT_MAX.
  /// Throws invalid_argument.
  mpi_comm with_max_count(std::size_t max_count) const {
    if (max_count < 1 || max_count > static_cast<std::size_t>(INT_MAX))
      throw invalid_argument("loom::mpi_comm::with_max_count: " + std::to_string(max_count) +
                             " is outside [1, INT_MAX]");
    mpi_comm c = *this;
    c.max_count_ = max_count;
    return c;
  }

  /// Collective: the ranks passing the same colour form a new communicator, ranked by
  /// (key, old rank) (MPI_Comm_split). Requires colour >= 0. Throws communication_error.
  mpi_comm split(int colour, int key) {
    if (colour < 0)
      detail::throw_mpi("split", rank_, "colour " + std::to_string(colour) + " is negative; colours must be >= 0");
    MPI_Comm part = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split(comm_, colour, key, &part), "split", rank_);
    mpi_comm c = attach(part, true);
    c.max_count_ = max_count_;
    return c;
  }

  /// Returns once every rank has entered the barrier. Throws communication_error.
  void barrier() {
    if (watch_) {
      MPI_Request r;
      check_start(MPI_Ibarrier(comm_, &r), "barrier");
      return watch_->wait(1, &r, MPI_STATUSES_IGNORE, "barrier", rank_);
    }
    detail::check_mpi(MPI_Barrier(comm_), "barrier", rank_);
  }

  /// Turns on failure detection (see detail::mpi_watch): from now on every operation waits at
  /// most `deadline_s` (set_deadline changes it) and throws loom::rank_failure instead of
  /// hanging when a peer is dead or stopped; loom::recover_world (loom/comm/mpi_recovery.hpp)
  /// then rebuilds the communicator over the survivors. Collective (duplicates the
  /// communicator for the survivors' messages, gathers every rank's host and process id, and
  /// agrees on a job id). Copies of this communicator share the detector.
  void watch_for_failures(double deadline_s);
  /// Failure detection on a communicator split from `whole`, which has it (watch_for_failures):
  /// every wait keeps whole's deadline and looks for a recovery message on whole's control
  /// communicator, so that one loom::recover_world over whole takes the roll call of every
  /// communicator of the job (a pipeline's stages, a tensor group, a data-parallel axis).
  /// Local (no communication). Throws communication_error when whole has no failure detector or
  /// this communicator has a rank outside whole.
  void watch_as_part_of(const mpi_comm& whole);
  /// Deadlines only (no control communicator, no peers): every wait from now on at most
  /// deadline_s; watch_for_failures then turns on the whole detector. (The joining of
  /// replacements: fault_options::replace.)
  void watch_deadlines_only(double deadline_s) {
    detail::ignore_broken_pipes();
    auto w = std::make_shared<detail::mpi_watch>();
    w->deadline_s = deadline_s;
    watch_ = std::move(w);
  }
  /// The deadline of every wait from now on (failure detection on), in seconds.
  void set_deadline(double deadline_s) noexcept {
    if (watch_) watch_->deadline_s = deadline_s;
  }
  /// The failure detector, null when off.
  detail::mpi_watch* watch() const noexcept { return watch_.get(); }
  std::shared_ptr<detail::mpi_watch> watch_shared() const noexcept { return watch_; }
  /// Gives this communicator the failure detector w (loom::recover_world hands the survivors'
  /// communicator its own).
  void attach_watch(std::shared_ptr<detail::mpi_watch> w) noexcept { watch_ = std::move(w); }
  /// Replaces this communicator (and its detector) by `other` — the survivors' communicator
  /// after a recovery. The old MPI communicator is left as it is, never freed: operations of
  /// the dead may still be pending on it.
  void replace_after_recovery(mpi_comm&& other);

  /// Prints "loom: rank R: message" (R: the rank in this communicator) to stderr and ends the
  /// whole job with exit code `code` (MPI_Abort), like loom::mpi::abort.
  [[noreturn]] void abort(int code, const std::string& message) const {
    std::fprintf(stderr, "loom: rank %d: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    detail::write_exit_status("failed " + std::to_string(code));
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

  /// Copies the root's data[0, count) to every rank's data. Throws communication_error.
  /// (Defined out of the class, so that a program calls the library's instantiations.)
  template <detail::comm_value T>
  void broadcast(T* data, std::size_t count, int root);

  /// In place: every rank's data[i] becomes op over all ranks' data[i]. Throws
  /// communication_error.
  template <detail::comm_reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    if (watch_) {
      return watched("allreduce", data, count, data, count, [&](const T*, T* d, std::vector<MPI_Request>& rs) {
        for_chunks(count, [&](std::size_t at, int n) {
          check_start(MPI_Iallreduce(MPI_IN_PLACE, d + at, n, type, detail::mpi_op<T>(op), comm_, &rs.emplace_back()),
                      "allreduce");
        });
      });
    }
    for_chunks(count, [&](std::size_t at, int n) {
      detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + at, n, type, detail::mpi_op<T>(op), comm_), "allreduce", rank_);
    });
  }

  /// in holds size() blocks of count; out[0, count) gets op over every rank's block rank().
  /// Requires in and out not to overlap. Throws communication_error.
  template <detail::comm_reducible T>
  void reduce_scatter(const T* in, T* out, std::size_t count, reduce_op op) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    if (watch_) {
      const std::size_t in_count = static_cast<std::size_t>(size_) * count;
      return watched("reduce_scatter", in, in_count, out, count, [&](const T* i, T* o, std::vector<MPI_Request>& rs) {
        if (count <= max_count_) {
          check_start(MPI_Ireduce_scatter_block(i, o, static_cast<int>(count), type, detail::mpi_op<T>(op), comm_,
                                                &rs.emplace_back()),
                      "reduce_scatter");
          return;
        }
        for_chunks(count, [&](std::size_t at, int n) {
          for (int j = 0; j < size_; ++j)
            check_start(MPI_Ireduce(i + static_cast<std::size_t>(j) * count + at, j == rank_ ? o + at : nullptr, n,
                                    type, detail::mpi_op<T>(op), j, comm_, &rs.emplace_back()),
                        "reduce_scatter");
        });
      });
    }
    if (count <= max_count_) {
      detail::check_mpi(MPI_Reduce_scatter_block(in, out, static_cast<int>(count), type, detail::mpi_op<T>(op), comm_),
                        "reduce_scatter", rank_);
      return;
    }
    for_chunks(count, [&](std::size_t at, int n) {
      for (int j = 0; j < size_; ++j)
        detail::check_mpi(MPI_Reduce(in + static_cast<std::size_t>(j) * count + at, j == rank_ ? out + at : nullptr,
                                     n, type, detail::mpi_op<T>(op), j, comm_),
                          "reduce_scatter", rank_);
    });
  }

  /// out (size() * count) gets every rank's in (count), block r from rank r. Requires in and
  /// out not to overlap. Throws communication_error.
  template <detail::comm_value T>
  void allgather(const T* in, T* out, std::size_t count) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    if (watch_ && count <= max_count_) {
      const int n = static_cast<int>(count);
      return watched("allgather", in, count, out, static_cast<std::size_t>(size_) * count,
                     [&](const T* i, T* o, std::vector<MPI_Request>& rs) {
                       check_start(MPI_Iallgather(i, n, type, o, n, type, comm_, &rs.emplace_back()), "allgather");
                     });
    }
    if (count <= max_count_) {
      const int n = static_cast<int>(count);
      detail::check_mpi(MPI_Allgather(in, n, type, out, n, type, comm_), "allgather", rank_);
      return;
    }
    std::copy(in, in + count, out + static_cast<std::size_t>(rank_) * count);
    if (watch_) {
      const std::size_t total = static_cast<std::size_t>(size_) * count;
      return watched("allgather", out, total, out, total, [&](const T*, T* o, std::vector<MPI_Request>& rs) {
        for_chunks(count, [&](std::size_t at, int n) {
          for (int j = 0; j < size_; ++j)
            check_start(MPI_Ibcast(o + static_cast<std::size_t>(j) * count + at, n, type, j, comm_, &rs.emplace_back()),
                        "allgather");
        });
      });
    }
    for_chunks(count, [&](std::size_t at, int n) {
      for (int j = 0; j < size_; ++j)
        detail::check_mpi(MPI_Bcast(out + static_cast<std::size_t>(j) * count + at, n, type, j, comm_), "allgather",
                          rank_);
    });
  }

  /// Sends data[0, count) to peer with tag (MPI_Send: may wait for the receiver).
  /// Throws communication_error.
  template <detail::comm_value T>
  void send(const T* data, std::size_t count, int peer, int tag) {
    check_rank("send", "peer", peer);
    const MPI_Datatype type = detail::mpi_datatype<T>();
    if (watch_) {
      return watched("send", data, count, static_cast<T*>(nullptr), 0, [&](const T* d, T*, std::vector<MPI_Request>& rs) {
        for_chunks(count, [&](std::size_t at, int n) {
          check_start(MPI_Isend(d + at, n, type, peer, tag, comm_, &rs.emplace_back()), "send");
        });
      });
    }
    for_chunks(count, [&](std::size_t at, int n) {
      detail::check_mpi(MPI_Send(data + at, n, type, peer, tag, comm_), "send", rank_);
    });
  }

  /// Receives count elements from peer with tag into data. Throws communication_error (also
  /// when the message holds a different count).
  template <detail::comm_value T>
  void recv(T* data, std::size_t count, int peer, int tag) {
    check_rank("recv", "peer", peer);
    const MPI_Datatype type = detail::mpi_datatype<T>();
    for_chunks(count, [&](std::size_t at, int n) {
      MPI_Status status;
      if (watch_) {
        watched(
            "recv", static_cast<const T*>(nullptr), 0, data + at, static_cast<std::size_t>(n),
            [&](const T*, T* d, std::vector<MPI_Request>& rs) {
              check_start(MPI_Irecv(d, n, type, peer, tag, comm_, &rs.emplace_back()), "recv");
            },
            &status);
      } else {
        detail::check_mpi(MPI_Recv(data + at, n, type, peer, tag, comm_, &status), "recv", rank_);
      }
      int got = 0;
      MPI_Get_count(&status, type, &got);
      if (got != n) detail::throw_mpi("recv", rank_, count_mismatch(n, got, peer, tag));
    });
  }

  /// Starts an in-place allreduce (MPI_Iallreduce); see allreduce. data must stay untouched
  /// until the request completes. Throws communication_error.
  template <detail::comm_reducible T>
  [[nodiscard]] request iallreduce(T* data, std::size_t count, reduce_op op);

  /// Starts a send (MPI_Isend); see send. Throws communication_error.
  template <detail::comm_value T>
  [[nodiscard]] request isend(const T* data, std::size_t count, int peer, int tag);

  /// Starts a receive (MPI_Irecv); see recv. Throws communication_error.
  template <detail::comm_value T>
  [[nodiscard]] request irecv(T* data, std::size_t count, int peer, int tag);

  /// Starts a reduce-scatter of blocks of different sizes: in holds size() consecutive
  /// blocks, block j of counts[j] elements; out[0, counts[rank()]) gets op over every rank's
  /// block rank(), combined in rank order (rank 0's, then rank 1's, ...). counts (size()
  /// values, the same on every rank) is copied. in and out must not overlap and stay untouched
  /// until the request completes. Throws communication_error. (ZeRO's gradient reduction:
  /// loom::shard_optimizer_state.)
  ///
  /// A direct exchange over point-to-point messages rather than MPI_Ireduce_scatter: every
  /// rank sends block j to rank j and receives its own block from every peer (tag
  /// reduce_scatter_tag, reserved on this communicator) into a scratch buffer the request
  /// owns, and combines them when the request completes (in its test() or wait()). It sends
  /// and receives what a ring does, (size() - 1) blocks, without the ring's steps that depend
  /// on each other. Measured with Open MPI 4.1 (2 ranks; benchmarks/allreduce `rs`): Open
  /// MPI's MPI_Ireduce_scatter (libnbc: a reduce to one rank, then a scatter) takes 1.2-4.6x
  /// the time of an MPI_Allreduce of the whole over shared memory and 0.8-1.5x over TCP,
  /// where a reduce-scatter should take about half; the direct exchange takes 0.8-1.1x and
  /// 0.4-0.8x.
  template <detail::comm_reducible T>
  [[nodiscard]] request ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op);

  /// Starts an in-place allgather of blocks of different sizes (MPI_Iallgatherv with
  /// MPI_IN_PLACE): data holds size() consecutive blocks, block j of counts[j] elements; this
  /// rank's block rank() is sent, and every other block is received from its rank. counts is
  /// copied. Throws communication_error.
  template <detail::comm_value T>
  [[nodiscard]] request iallgather_v(T* data, const std::size_t* counts);

  /// ireduce_scatter_v, blocking (MPI_Reduce_scatter: Open MPI's blocking collectives are
  /// faster than its non-blocking ones, see benchmarks/allreduce). Throws communication_error.
  template <detail::comm_reducible T>
  void reduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
    if (watch_ || !v_fits(counts)) return ireduce_scatter_v(in, out, counts, op).wait();
    std::vector<int> c(static_cast<std::size_t>(size_));
    for (std::size_t j = 0; j < c.size(); ++j) c[j] = static_cast<int>(counts[j]);
    detail::check_mpi(MPI_Reduce_scatter(in, out, c.data(), detail::mpi_datatype<T>(), detail::mpi_op<T>(op), comm_),
                      "reduce_scatter_v", rank_);
  }
  /// iallgather_v, blocking (MPI_Allgatherv in place). Throws communication_error.
  template <detail::comm_value T>
  void allgather_v(T* data, const std::size_t* counts) {
    if (watch_ || !v_fits(counts)) return iallgather_v(data, counts).wait();
    const std::size_t n = static_cast<std::size_t>(size_);
    std::vector<int> c(2 * n);
    for (std::size_t j = 0, at = 0; j < n; at += counts[j], ++j) {
      c[j] = static_cast<int>(counts[j]);
      c[n + j] = static_cast<int>(at);
    }
    detail::check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c.data(), c.data() + n,
                                     detail::mpi_datatype<T>(), comm_),
                      "allgather_v", rank_);
  }

 private:
  /// Waits for rs through the failure detector (watch_ is set).
  void complete(std::vector<MPI_Request>& rs, const char* op, MPI_Status* st = MPI_STATUSES_IGNORE) {
    watch_->wait(static_cast<int>(rs.size()), rs.data(), st, op, rank_);
  }

  /// Under failure detection a blocking operation runs non-blocking and waits through the
  /// detector. When that wait fails, its MPI requests stay pending, and a peer that was only
  /// late (not dead) completes them later: MPI then writes into the buffers they were given
  /// (measured: rank 0 of 2 took 1.5 s over a checkpoint, the other's deadline expired, and a
  /// late allreduce overwrote that rank's stack inside the recovery, which crashed). So an
  /// operation of at most staged_bytes (the trainer's flags, sums and agreements, often on the
  /// stack) runs on a heap copy, which a failure leaves to MPI for the life of the process; a
  /// larger one works in place, and its buffers are the caller's to retire after a failure
  /// (loom::model::renew_gradients).
  static constexpr std::size_t staged_bytes = 64 * 1024;
  /// start(in', out', requests) starts the operation on in' (in_count elements; in itself when
  /// in == out, in place) and out' (out_count), then waits for the requests (statuses into st:
  /// one request only) — on copies when they are small.
  template <class T, class Start>
  void watched(const char* op, const T* in, std::size_t in_count, T* out, std::size_t out_count, Start&& start,
               MPI_Status* st = MPI_STATUSES_IGNORE) {
    std::vector<MPI_Request> rs;
    const bool in_place = in == out && out != nullptr;
    const std::size_t n = out_count + (in_place ? 0 : in_count);
    if (n * sizeof(T) > staged_bytes) {
      start(in, out, rs);
      return complete(rs, op, st);
    }
    std::unique_ptr<std::byte[]> stage(new std::byte[std::max<std::size_t>(1, n) * sizeof(T)]);
    T* o = reinterpret_cast<T*>(stage.get());
    T* i = in_place ? o : o + out_count;
    if (in_count) std::memcpy(i, in, in_count * sizeof(T));
    try {
      start(i, o, rs);
      complete(rs, op, st);
    } catch (...) {
      (void)stage.release();  // MPI may still read or write it: never freed
      throw;
    }
    if (out_count) std::memcpy(out, o, out_count * sizeof(T));
  }

  /// The return code of an MPI call that starts operation op: an error throws rank_failure under
  /// failure detection (mpi_watch::refused: a dead peer's doing), communication_error otherwise.
  /// An error of the caller's arguments (a tag above MPI_TAG_UB, a bad count or type) stays a
  /// communication_error: a recovery would only meet it again.
  void check_start(int code, const char* op) const {
    if (code == MPI_SUCCESS) return;
    if (watch_ && !detail::mpi_argument_error(code)) watch_->refused(op, rank_, code);
    detail::check_mpi(code, op, rank_);
  }

  /// An empty request of operation op on this communicator (its rank and failure detector).
  request new_request(const char* op) const;

  /// Whether blocks of counts (size() of them) go in one MPI call: each at most max_count()
  /// and all of them within int.
  bool v_fits(const std::size_t* counts) const noexcept {
    std::size_t total = 0;
    bool fits = true;
    for (int j = 0; j < size_; ++j) {
      total += counts[j];
      fits = fits && counts[j] <= max_count_;
    }
    return fits && total <= static_cast<std::size_t>(INT_MAX);
  }

  /// Calls f(offset, n) for consecutive chunks of at most max_count_ elements; once for 0.
  template <class F>
  void for_chunks(std::size_t count, F&& f) const {
    std::size_t at = 0;
    do {
      const std::size_t n = std::min(count - at, max_count_);
      f(at, static_cast<int>(n));
      at += n;
    } while (at < count);
  }

  void check_rank(const char* op, const char* what, int r) const;

  static std::string count_mismatch(int want, int got, int peer, int tag);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<const boost::mpi::communicator> owner_;  // owns comm_ (Boost.MPI's handle)
  int rank_ = 0;
  int size_ = 1;
  std::size_t max_count_ = static_cast<std::size_t>(INT_MAX);
  std::shared_ptr<detail::mpi_watch> watch_;  // failure detection; null: off
};

/// A pending mpi_comm operation: one MPI request per chunk. Movable; wait() blocks until it
/// completes (MPI_Wait), test() says whether it has (MPI_Test, which also drives MPI's
/// progress); both are no-ops once it has completed or on a default-constructed request. A
/// request destroyed while pending waits in its destructor (an MPI request is never leaked);
/// an error there is printed to stderr, as a destructor cannot throw.
class mpi_comm::request {
 public:
  request() = default;
  request(request&& other) noexcept { take(other); }
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish();
      take(other);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish(); }

  /// Blocks until the operation has completed. Throws communication_error (loom::rank_failure
  /// under failure detection).
  LOOM_MPI_DECL void wait();

  /// True once the operation has completed. Throws communication_error.
  LOOM_MPI_DECL bool test();

 private:
  friend class mpi_comm;

  struct part {
    MPI_Request handle = MPI_REQUEST_NULL;
    int expected = -1;  // a receive: the count the message must hold
    int from = -1;      // a receive of a collective made of messages: its sender (else the request's peer)
  };

  LOOM_MPI_DECL std::string check(const MPI_Status& status, const part& p) const;

  void take(request& other) noexcept {
    parts_ = std::move(other.parts_);
    other.parts_.clear();
    next_ = std::exchange(other.next_, 0);
    type_ = other.type_;
    op_ = other.op_;
    rank_ = other.rank_;
    peer_ = other.peer_;
    tag_ = other.tag_;
    watch_ = std::move(other.watch_);
    generation_ = other.generation_;
    arrays_ = std::move(other.arrays_);
    scratch_ = std::move(other.scratch_);
    then_ = std::move(other.then_);
    other.then_ = nullptr;
  }

  /// The parts have all completed without error: the continuation, once.
  void completed() {
    if (then_) std::exchange(then_, nullptr)();
  }

  /// Under failure detection, waits through the detector; a request of a communicator that a
  /// failure broke (or that a recovery replaced) is abandoned: it may never complete.
  void watched_wait();
  /// Forgets the pending parts (their MPI requests stay pending inside MPI, never freed). The
  /// memory they may still write into is leaked on purpose, never freed under them.
  void abandon() noexcept {
    if (next_ < parts_.size() && scratch_) new std::shared_ptr<void>(std::move(scratch_));
    parts_.clear();
    next_ = 0;
    then_ = nullptr;
  }

  void finish() noexcept {
    if (next_ >= parts_.size()) return;
    if (watch_ && (watch_->broken || (watch_->whole && watch_->whole->broken) || watch_->generation != generation_))
      return abandon();
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: rank %d: %s (in a request's destructor)\n", rank_, e.what());
    }
  }

  std::vector<part> parts_;
  std::size_t next_ = 0;  // parts before it have completed
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  const char* op_ = "";
  int rank_ = 0, peer_ = -1, tag_ = -1;
  std::shared_ptr<detail::mpi_watch> watch_;  // the communicator's failure detector, if on
  std::uint64_t generation_ = 0;
  std::shared_ptr<std::vector<int>> arrays_;  // counts and displacements MPI reads until completion
  std::shared_ptr<void> scratch_;             // memory MPI writes until completion (ireduce_scatter_v)
  std::function<void()> then_;                // run once when every part has completed without error
};

inline mpi_comm::request mpi_comm::new_request(const char* op) const {
  request r;
  r.op_ = op;
  r.rank_ = rank_;
  r.watch_ = watch_;
  r.generation_ = watch_ ? watch_->generation : 0;
  return r;
}

template <detail::comm_reducible T>
mpi_comm::request mpi_comm::iallreduce(T* data, std::size_t count, reduce_op op) {
  request r = new_request("iallreduce");
  r.type_ = detail::mpi_datatype<T>();
  for_chunks(count, [&](std::size_t at, int n) {
    request::part p;
    check_start(MPI_Iallreduce(MPI_IN_PLACE, data + at, n, r.type_, detail::mpi_op<T>(op), comm_, &p.handle),
                "iallreduce");
    r.parts_.push_back(p);
  });
  return r;
}

template <detail::comm_value T>
mpi_comm::request mpi_comm::isend(const T* data, std::size_t count, int peer, int tag) {
  check_rank("isend", "peer", peer);
  request r = new_request("isend");
  r.peer_ = peer;
  r.tag_ = tag;
  r.type_ = detail::mpi_datatype<T>();
  for_chunks(count, [&](std::size_t at, int n) {
    request::part p;
    check_start(MPI_Isend(data + at, n, r.type_, peer, tag, comm_, &p.handle), "isend");
    r.parts_.push_back(p);
  });
  return r;
}

template <detail::comm_value T>
mpi_comm::request mpi_comm::irecv(T* data, std::size_t count, int peer, int tag) {
  check_rank("irecv", "peer", peer);
  request r = new_request("irecv");
  r.peer_ = peer;
  r.tag_ = tag;
  r.type_ = detail::mpi_datatype<T>();
  for_chunks(count, [&](std::size_t at, int n) {
    request::part p;
    p.expected = n;
    check_start(MPI_Irecv(data + at, n, r.type_, peer, tag, comm_, &p.handle), "irecv");
    r.parts_.push_back(p);
  });
  return r;
}

namespace detail {
/// b[i] = op(b[i], a[i]) for n values (sums of 16-bit floats in float, rounded; see half.hpp).
template <class T>
void combine_into(reduce_op op, const T* a, T* b, std::size_t n) {
  if constexpr (is_half_v<T>) {
    if (op == reduce_op::sum) return add_half(a, b, n);
    for (std::size_t i = 0; i < n; ++i)
      if (a[i].to_float() > b[i].to_float()) b[i] = a[i];
  } else {
    if (op == reduce_op::sum) {
      for (std::size_t i = 0; i < n; ++i) b[i] += a[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) b[i] = std::max(b[i], a[i]);
    }
  }
}
}  // namespace detail

template <detail::comm_reducible T>
mpi_comm::request mpi_comm::ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
  request r = new_request("ireduce_scatter_v");
  r.type_ = detail::mpi_datatype<T>();
  const std::size_t n = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
  std::vector<std::size_t> at(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j) at[j + 1] = at[j] + counts[j];
  const std::size_t mine = counts[me];
  // Peer p's block `me` lands in slot p (p < me) or p - 1 (p > me) of the scratch buffer.
  auto scratch = std::make_shared<std::vector<T>>((n - 1) * mine);
  T* slots = scratch->data();
  r.peer_ = -1;
  r.tag_ = reduce_scatter_tag;
  if (mine)
    for (std::size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      T* slot = slots + (p < me ? p : p - 1) * mine;
      for_chunks(mine, [&](std::size_t k, int m) {
        request::part q;
        q.expected = m;
        q.from = static_cast<int>(p);
        check_start(MPI_Irecv(slot + k, m, r.type_, static_cast<int>(p), reduce_scatter_tag, comm_, &q.handle),
                    "ireduce_scatter_v");
        r.parts_.push_back(q);
      });
    }
  for (std::size_t p = 0; p < n; ++p) {
    if (p == me || counts[p] == 0) continue;
    for_chunks(counts[p], [&](std::size_t k, int m) {
      request::part q;
      check_start(MPI_Isend(in + at[p] + k, m, r.type_, static_cast<int>(p), reduce_scatter_tag, comm_, &q.handle),
                  "ireduce_scatter_v");
      r.parts_.push_back(q);
    });
  }
  // Once everything has arrived: out = block 0 op block 1 op ... in rank order (this rank's own
  // block from in, the others' from their slots).
  const T* own = in + at[me];
  r.then_ = [op, own, out, slots, mine, n, me] {
    if (mine == 0) return;
    auto block = [&](std::size_t p) { return p == me ? own : slots + (p < me ? p : p - 1) * mine; };
    std::copy(block(0), block(0) + mine, out);
    for (std::size_t p = 1; p < n; ++p) detail::combine_into(op, block(p), out, mine);
  };
  r.scratch_ = std::move(scratch);
  return r;
}

template <detail::comm_value T>
mpi_comm::request mpi_comm::iallgather_v(T* data, const std::size_t* counts) {
  request r = new_request("iallgather_v");
  r.type_ = detail::mpi_datatype<T>();
  const std::size_t n = static_cast<std::size_t>(size_);
  if (v_fits(counts)) {
    r.arrays_ = std::make_shared<std::vector<int>>(2 * n);
    int* c = r.arrays_->data();
    int* d = c + n;
    for (std::size_t j = 0, at = 0; j < n; at += counts[j], ++j) {
      c[j] = static_cast<int>(counts[j]);
      d[j] = static_cast<int>(at);
    }
    request::part p;
    check_start(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c, d, r.type_, comm_, &p.handle),
                "iallgather_v");
    r.parts_.push_back(p);
    return r;
  }
  // Blocks above max_count(): one broadcast per rank and chunk, from that rank.
  std::size_t at = 0;
  for (std::size_t j = 0; j < n; ++j) {
    for_chunks(counts[j], [&](std::size_t k, int m) {
      request::part p;
      check_start(MPI_Ibcast(data + at + k, m, r.type_, static_cast<int>(j), comm_, &p.handle), "iallgather_v");
      r.parts_.push_back(p);
    });
    at += counts[j];
  }
  return r;
}

template <detail::comm_value T>
void mpi_comm::broadcast(T* data, std::size_t count, int root) {
  check_rank("broadcast", "root", root);
  const MPI_Datatype type = detail::mpi_datatype<T>();
  if (watch_) {
    return watched("broadcast", data, count, data, count, [&](const T*, T* d, std::vector<MPI_Request>& rs) {
      for_chunks(count, [&](std::size_t at, int n) {
        check_start(MPI_Ibcast(d + at, n, type, root, comm_, &rs.emplace_back()), "broadcast");
      });
    });
  }
  for_chunks(count, [&](std::size_t at, int n) {
    detail::check_mpi(MPI_Bcast(data + at, n, type, root, comm_), "broadcast", rank_);
  });
}

// The instantiations loom itself uses, compiled once in loom_compiled_mpi under
// LOOM_SEPARATE_COMPILATION_MPI (LOOM_INSTANTIATE_MPI, loom/core/config.hpp).
LOOM_INSTANTIATE_MPI(void mpi_comm::broadcast<float>(float*, std::size_t, int))
LOOM_INSTANTIATE_MPI(void mpi_comm::broadcast<char>(char*, std::size_t, int))
LOOM_INSTANTIATE_MPI(void mpi_comm::broadcast<std::uint64_t>(std::uint64_t*, std::size_t, int))
LOOM_INSTANTIATE_MPI(void mpi_comm::broadcast<double>(double*, std::size_t, int))
LOOM_INSTANTIATE_MPI(void mpi_comm::allreduce<float>(float*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(void mpi_comm::allreduce<double>(double*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(void mpi_comm::allreduce<std::uint64_t>(std::uint64_t*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(void mpi_comm::allreduce<bf16>(bf16*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(void mpi_comm::allreduce<fp16>(fp16*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(void mpi_comm::allgather<char>(const char*, char*, std::size_t))
LOOM_INSTANTIATE_MPI(void mpi_comm::allgather<double>(const double*, double*, std::size_t))
LOOM_INSTANTIATE_MPI(void mpi_comm::send<float>(const float*, std::size_t, int, int))
LOOM_INSTANTIATE_MPI(void mpi_comm::recv<float>(float*, std::size_t, int, int))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::iallreduce<float>(float*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::iallreduce<bf16>(bf16*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::iallreduce<fp16>(fp16*, std::size_t, reduce_op))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::isend<float>(const float*, std::size_t, int, int))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::irecv<float>(float*, std::size_t, int, int))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::ireduce_scatter_v<float>(const float*, float*, const std::size_t*, reduce_op))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::ireduce_scatter_v<bf16>(const bf16*, bf16*, const std::size_t*, reduce_op))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::ireduce_scatter_v<fp16>(const fp16*, fp16*, const std::size_t*, reduce_op))
LOOM_INSTANTIATE_MPI(mpi_comm::request mpi_comm::iallgather_v<float>(float*, const std::size_t*))
LOOM_INSTANTIATE_MPI(void mpi_comm::reduce_scatter_v<float>(const float*, float*, const std::size_t*, reduce_op))
LOOM_INSTANTIATE_MPI(void mpi_comm::allgather_v<float>(float*, const std::size_t*))

static_assert(communicator<mpi_comm>);

}  // namespace loom

#if defined(LOOM_MPI_DEFINITIONS_VISIBLE)
#include "loom/comm/impl/mpi.ipp"
#include "loom/comm/impl/mpi_recovery.ipp"
#endif

#include "loom/comm/impl/data_parallel_mpi.hpp"
