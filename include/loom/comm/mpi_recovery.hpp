// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::recover_world: after a loom::rank_failure, the survivors of a watched loom::mpi_comm
// agree on who goes on and rebuild the communicator over them, on plain Open MPI (no ULFM):
// under `mpirun --enable-recovery` the runtime keeps them alive, a collective that involves a
// dead rank just never finishes, and MPI_Comm_create_group — collective over the new group
// only — builds a working communicator of the survivors. The protocol, and why the world
// cannot split in two (docs/fault-tolerance.md):
//
// 1. Roll call (detail::take_roll_call). Every survivor sends its state (the steps it finished,
//    its last completed operation, where it is now) to every rank on the control communicator, and
//    listens for the others' for `window_s`. A rank waiting in a collective sees the first such
//    message within a millisecond and joins; one that computes joins at its next collective.
// 2. Verdict (detail::agree_on_verdict, exchange_ready, decide_round). The ranks heard from are
//    this rank's proposal. The first proposal to be linked (link(2): atomic, fails if the name
//    exists — also on NFS) as `epoch-<e>` in the shared verdict directory is the verdict for
//    everyone; every survivor reads it. One file per epoch, so there is exactly one membership per
//    epoch, however the network is partitioned: a rank the verdict leaves out leaves the job (and
//    a survivor on its host kills it, so that a stopped process cannot come back into a
//    communicator it is no longer part of). Then every member says it is ready and waits for the
//    others' ready; whether the round goes on to the rebuild or starts again without the members
//    that did not answer is decided once, as the verdict is: the first of the members' proposals
//    (go or retry) linked as `epoch-<e>.decision`, so that no member rebuilds while another starts
//    again.
// 3. Rebuild (detail::rebuild_world). The members create the communicator of the verdict's
//    group with MPI_Comm_create_group and a new control communicator; the old ones are abandoned,
//    never freed (operations of the dead are pending on them). A member that died after the
//    verdict makes the next collective fail, and the next epoch's recovery leaves it out; one that
//    dies inside MPI_Comm_create_group (milliseconds) blocks it, so a watchdog ends the process
//    after rebuild_timeout_s with status 75 and the launcher restarts the job from its checkpoint.
//
// The state (which step every survivor continues from) is the trainer's business: see
// loom::trainer's recovery. These are declarations over loom::mpi_comm, which loom/comm/mpi.hpp
// defines; mpi.hpp includes this header, and its definitions with its own (impl/mpi_recovery.ipp).

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/open_mpi.hpp"
#include "loom/core/config.hpp"
#include "loom/core/fault.hpp"

namespace loom {

class mpi_comm;

namespace detail {

/// A survivor's message in the roll call (sent as bytes between processes of one program).
struct roll_message {
  std::uint64_t generation = 0;
  std::uint64_t committed_step = 0;
  std::uint64_t last_step = 0, now_step = 0;
  std::int32_t last_bucket = -1, now_bucket = -1;
  std::uint8_t last_phase = 0, now_phase = 0;
  char last_op[30] = {};
};

LOOM_MPI_DECL std::string read_small_file(const std::filesystem::path& p);

/// Links `text` as `final` unless something already is there; returns what is there now.
/// `durable`: fsync the file first (a verdict; a round's decision, read only while the
/// survivors wait for it, skips that: its milliseconds widen the window in which a death
/// blocks the rebuild). Throws communication_error when the directory cannot be written.
LOOM_MPI_DECL std::string link_verdict(const std::filesystem::path& dir, const std::filesystem::path& final, const std::string& text,
                                       int rank, bool durable = true);

/// Ends the process (status 75, so that the launcher restarts the job from its newest
/// checkpoint) when a blocking MPI call that no deadline can abandon — a communicator's rebuild,
/// a spawn, a merge — has not finished within timeout_s; `what` names it (see the file comment).
class deadline_watchdog {
 public:
  deadline_watchdog(double timeout_s, std::string what) : thread_([this, timeout_s, what = std::move(what)] {
    std::unique_lock<std::mutex> lock(m_);
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return done_; })) {
      std::fprintf(stderr,
                   "loom: %s did not finish within %.1f s; ending this process (status 75) so that the launcher "
                   "restarts the job from its newest checkpoint\n",
                   what.c_str(), timeout_s);
      std::fflush(stderr);
      write_exit_status("failed 75");
      std::_Exit(75);
    }
  }) {}
  ~deadline_watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace detail

/// Runs the recovery protocol (see the file comment) on c, which a rank_failure broke: on
/// return c is the survivors' communicator, with its own failure detector (the same deadline),
/// unless result.excluded, when this rank is not among them and must leave (c unchanged).
/// Collective over the survivors. Throws communication_error when c has no failure detector
/// or the verdict directory cannot be written.
LOOM_MPI_DECL recovery_result recover_world(mpi_comm& c, const recovery_request& q);

/// The fencing of a recovery: the first member (lowest rank of c left in, not released) on the host of each
/// rank that res left out ends that rank's process (SIGKILL, only if it still runs this
/// program), so that a stopped process cannot come back into a job that went on without it.
/// Returns the processes this rank ended. recover_world does it before the rebuild; with
/// recovery_request::rebuild false the caller does it, after its report.
LOOM_MPI_DECL std::vector<long> fence_left_out(const mpi_comm& c, const recovery_result& res);

/// What loom::spawn_replacements did.
struct replacement_spawn {
  bool ok = false;
  std::string why;                 // why not (ok false), on rank 0
  /// The survivors (ranks kept) and the newcomers after them (ok). Never freed: after a
  /// failed join the newcomers may still have operations pending on it.
  std::shared_ptr<mpi_comm> world;
  double spawn_s = 0, merge_s = 0;
  std::string command;             // the program started (rank 0)
};

namespace detail {
/// This process's arguments after the program's name (/proc/self/cmdline).
LOOM_MPI_DECL std::vector<std::string> own_arguments();

}  // namespace detail

/// After a recovery (fault_options::replace): starts hosts.size() processes of this very
/// program with its arguments, one on each host named (empty: where the runtime places it),
/// and merges them with the survivors of c into one communicator, the survivors first with
/// their ranks kept. Collective over c (the survivors' communicator, watched).
///
/// Rank 0 alone spawns (MPI_Comm_spawn_multiple over MPI_COMM_SELF): a collective spawn that
/// fails at its root leaves the other ranks of Open MPI 4.1 waiting in it forever (measured:
/// "All nodes which are allocated for this job are already filled" returned MPI_ERR_SPAWN at
/// the root, and the others never returned). It tells the others the outcome with a watched
/// broadcast; then all build the intercommunicator with the newcomers (rank 0's merged
/// intercommunicator as the bridge) and merge it. Returns ok false with the reason when the
/// spawn fails: the survivors go on as they are. A spawn or merge that never returns ends the
/// process after timeout_s (status 75). The newcomers' side is loom::mpi::environment's.
LOOM_MPI_DECL replacement_spawn spawn_replacements(mpi_comm& c, const std::vector<std::string>& hosts, double timeout_s);

}  // namespace loom
