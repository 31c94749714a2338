// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of mpi.hpp's non-template functions (the failure detector's wait, the
// communicator's set-up and its detector, a replacement's joining): included at the end of the
// header (header-only), or compiled once in src/loom_mpi.cpp (loom::compiled_mpi,
// LOOM_SEPARATE_COMPILATION_MPI; see loom/core/config.hpp).

#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>

#include "loom/comm/mpi.hpp"

namespace loom {

namespace detail {

LOOM_MPI_DECL std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

LOOM_MPI_DECL bool runs_this_program(long pid) {
  std::error_code ec;
  const auto mine = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return false;
  const auto theirs = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return !ec && theirs == mine;
}

LOOM_MPI_DECL local_evidence evidence_of(const mpi_peer& p, const std::string& my_host) {
  // LOOM_FAULT_NO_LOCAL_EVIDENCE=1: behave as if every peer were on another host (benchmarks
  // and tests of the cross-host path on one machine).
  static const bool off = [] {
    const char* v = std::getenv("LOOM_FAULT_NO_LOCAL_EVIDENCE");
    return v && *v && *v != '0';
  }();
  if (off || p.host != my_host) return local_evidence::unknown;
  std::ifstream in("/proc/" + std::to_string(p.pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return local_evidence::gone;
  const std::size_t close = stat.rfind(')');
  const char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
  if (state == 'Z' || state == 'X' || state == 'x') return local_evidence::gone;
  if (!runs_this_program(p.pid)) return local_evidence::gone;  // the pid is another program's now
  if (state == 'T' || state == 't') return local_evidence::stopped;
  return local_evidence::alive;
}

}  // namespace detail

LOOM_MPI_DECL void detail::mpi_watch::wait(int n, MPI_Request* r, MPI_Status* st, const char* op, int rank) {
  if (broken)
    throw rank_failure(rank_failure::kind::peer_recovery, op, 0, -1,
                       std::string("loom::mpi_comm::") + op + ": rank " + std::to_string(rank) +
                           ": the communicator is broken by an earlier failure (recover first)");
  const auto t0 = clock::now();
  auto next_look = t0 + std::chrono::milliseconds(1), next_local = t0;
  for (unsigned spins = 0;; ++spins) {
    int done = 0;
    const int rc = MPI_Testall(n, r, &done, st);
    if (rc != MPI_SUCCESS) fail(rank_failure::kind::mpi_error, op, rank, t0, -1, mpi_error_string(rc));
    if (done) {
      last_op = op;
      last_done = detail_here();
      if (whole) {
        whole->last_op = op;
        whole->last_done = last_done;
      }
      return;
    }
    if (spins % 64 == 0) {
      const auto now = clock::now();
      if (now >= next_look) {
        next_look = now + std::chrono::milliseconds(1);
        const double waited = std::chrono::duration<double>(now - t0).count();
        if (ctl != MPI_COMM_NULL) {
          int flag = 0;
          MPI_Status s;
          MPI_Iprobe(MPI_ANY_SOURCE, recovery_tag, ctl, &flag, &s);
          if (flag)
            fail(rank_failure::kind::peer_recovery, op, rank, t0, s.MPI_SOURCE,
                 "rank " + std::to_string(s.MPI_SOURCE) + " started a recovery");
        }
        // SIGTERM while a collective does not finish: mpirun ends the job because a peer
        // died (it sends SIGKILL a second later). A preemption's SIGTERM finds the peers
        // alive: their collectives finish within this grace.
        if (fault_state.preemption_signal == SIGTERM && waited > 0.1)
          fail(rank_failure::kind::terminating, op, rank, t0, -1, "SIGTERM arrived while it waited");
        const double deadline = deadline_s > 0 ? deadline_s : whole ? whole->deadline_s : fault_state.shared_deadline_s;
        if (deadline > 0 && waited > deadline)
          fail(rank_failure::kind::deadline, op, rank, t0, -1,
               "not finished within its deadline of " + std::to_string(deadline) + " s");
        // A peer on this host whose process is gone will never come: no need to wait out the
        // deadline (looked at every 10 ms once a wait is long).
        if (waited > 0.05 && now >= next_local && static_cast<std::size_t>(rank) < peers.size()) {
          next_local = now + std::chrono::milliseconds(10);
          for (std::size_t p = 0; p < peers.size(); ++p)
            if (static_cast<int>(p) != rank && evidence_of(peers[p], peers[static_cast<std::size_t>(rank)].host) == local_evidence::gone)
              fail(rank_failure::kind::peer_gone, op, rank, t0, static_cast<int>(p),
                   "rank " + std::to_string(p) + " (pid " + std::to_string(peers[p].pid) + ", this host) is gone");
        }
      }
    }
    if (spins > 256) sched_yield();  // let a rank that shares this core compute
  }
}

LOOM_MPI_DECL void detail::mpi_watch::fail(rank_failure::kind k, const char* op, int rank, clock::time_point t0,
                                           int peer, const std::string& why) {
  broken = true;
  if (whole) whole->broken = true;
  const double waited = std::chrono::duration<double>(clock::now() - t0).count();
  throw rank_failure(k, op, waited, peer,
                     std::string("loom::mpi_comm::") + op + ": rank " + std::to_string(rank) + " (" +
                         to_string(fault_state.here) + "): " + why + " (waited " + std::to_string(waited) +
                         " s; last completed here: " + last_op + " at " + to_string(last_done) + ")");
}

LOOM_MPI_DECL bool detail::restore_event_polling_after_failure() {
#if defined(OPEN_MPI) && OPEN_MPI
  if (std::getenv("OMPI_MCA_mpi_event_tick_rate")) return false;  // the user's own tick
  void* f = ::dlsym(RTLD_DEFAULT, "opal_progress_set_event_poll_rate");
  if (!f) return false;
  reinterpret_cast<void (*)(int)>(f)(1);  // microseconds
  return true;
#else
  return false;
#endif
}

LOOM_MPI_DECL bool detail::ignore_broken_pipes() {
  struct sigaction now {};
  if (::sigaction(SIGPIPE, nullptr, &now) != 0) return false;
  if ((now.sa_flags & SA_SIGINFO) != 0 || now.sa_handler != SIG_DFL) return false;  // the program's own choice
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  return ::sigaction(SIGPIPE, &ignore, nullptr) == 0;
}

LOOM_MPI_DECL mpi::environment::environment(int& argc, char**& argv)
    : env_(std::make_shared<boost::mpi::environment>(argc, argv, boost::mpi::threading::funneled, true)) {
  set_up();
}
LOOM_MPI_DECL mpi::environment::environment()
    : env_(std::make_shared<boost::mpi::environment>(boost::mpi::threading::funneled, true)) {
  set_up();
}
LOOM_MPI_DECL const boost::mpi::environment& mpi::environment::boost_environment() const noexcept { return *env_; }

LOOM_MPI_DECL void mpi::environment::set_up() {
  if (boost::mpi::environment::thread_level() < boost::mpi::threading::funneled)
    throw communication_error("loom::mpi::environment: MPI does not provide MPI_THREAD_FUNNELED");
  detail::check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "environment", 0);
  // The runtime keeps survivors alive: no communicator may wait forever for a dead peer.
  if (runtime_keeps_survivors()) {
    if (detail::fault_state.shared_deadline_s == 0) detail::fault_state.shared_deadline_s = 60;
    detail::ignore_broken_pipes();  // a survivor must not die writing to a dead peer's socket
  }
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent != MPI_COMM_NULL) join_survivors(parent);
}

LOOM_MPI_DECL void mpi::environment::join_survivors(MPI_Comm parent) {
  detail::exit_status_name = "replacement-" + std::to_string(::getpid());
  detail::fault_state.replacement_started_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
  MPI_Comm bridge = MPI_COMM_NULL, inter = MPI_COMM_NULL, world = MPI_COMM_NULL;
  detail::check_mpi(MPI_Intercomm_merge(parent, 1, &bridge), "environment (replacement: merge with the parent)", 0);
  detail::check_mpi(MPI_Intercomm_create(MPI_COMM_WORLD, 0, bridge, 0, detail::replacement_tag, &inter),
                    "environment (replacement: intercommunicator with the survivors)", 0);
  detail::check_mpi(MPI_Intercomm_merge(inter, 1, &world), "environment (replacement: merge with the survivors)", 0);
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  detail::joined_world = world;
  detail::fault_state.joining_as_replacement = true;
  detail::restore_event_polling_after_failure();
  detail::ignore_broken_pipes();
  // The survivors' job has dead processes: MPI_Finalize's fence may never end (as after a
  // recovery).
  detail::fault_state.recovered = true;
}

LOOM_MPI_DECL mpi_comm::mpi_comm(const boost::mpi::communicator& comm) {
  if (!detail::mpi_running())
    throw communication_error("loom::mpi_comm: MPI is not running: construct a loom::mpi::environment first");
  if (!comm) throw communication_error("loom::mpi_comm: the communicator is null (MPI_COMM_NULL)");
  owner_ = std::make_shared<const boost::mpi::communicator>(comm);
  comm_ = *owner_;
  detail::check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "mpi_comm", 0);
  detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "mpi_comm", 0);
  detail::check_mpi(MPI_Comm_size(comm_, &size_), "mpi_comm", rank_);
  if (detail::fault_state.shared_deadline_s > 0) {
    // Deadlines only (detail::fault_state.shared_deadline_s): no control communicator, no roll call.
    watch_ = std::make_shared<detail::mpi_watch>();
    watch_->deadline_s = 0;
  }
}

LOOM_MPI_DECL mpi_comm mpi_comm::attach(MPI_Comm comm, bool take_ownership) {
  if (!detail::mpi_running())
    throw communication_error("loom::mpi_comm: MPI is not running: construct a loom::mpi::environment first");
  if (comm == MPI_COMM_NULL) throw communication_error("loom::mpi_comm: the communicator is null (MPI_COMM_NULL)");
  return mpi_comm(boost::mpi::communicator(comm, take_ownership ? boost::mpi::comm_take_ownership : boost::mpi::comm_attach));
}

LOOM_MPI_DECL const boost::mpi::communicator& mpi_comm::boost_communicator() const noexcept { return *owner_; }

LOOM_MPI_DECL void mpi_comm::watch_for_failures(double deadline_s) {
  if (watch_ && watch_->ctl != MPI_COMM_NULL) return set_deadline(deadline_s);
  detail::ignore_broken_pipes();
  auto w = std::make_shared<detail::mpi_watch>();
  detail::check_mpi(MPI_Comm_dup(comm_, &w->ctl), "watch_for_failures", rank_);
  MPI_Comm_set_errhandler(w->ctl, MPI_ERRORS_RETURN);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  struct me_t {
    long pid;
    int world_rank;
    char host[256];
  } me{static_cast<long>(::getpid()), 0, {}};
  std::copy(host, host + sizeof host, me.host);
  MPI_Comm_rank(MPI_COMM_WORLD, &me.world_rank);
  if (detail::joined_world != MPI_COMM_NULL) me.world_rank = -1;  // a replacement: not of the job's MPI_COMM_WORLD
  std::vector<me_t> all(static_cast<std::size_t>(size_));
  detail::check_mpi(MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, comm_),
                    "watch_for_failures", rank_);
  for (const auto& a : all) w->peers.push_back({a.world_rank, a.pid, std::string(a.host)});
  unsigned long long id[2] = {static_cast<unsigned long long>(::getpid()),
                              static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count())};
  detail::check_mpi(MPI_Bcast(id, 2, MPI_UNSIGNED_LONG_LONG, 0, comm_), "watch_for_failures", rank_);
  w->job_id = std::to_string(id[0]) + "-" + std::to_string(id[1] % 1000000007ULL);
  w->deadline_s = deadline_s;
  watch_ = std::move(w);
}

LOOM_MPI_DECL void mpi_comm::watch_as_part_of(const mpi_comm& whole) {
  const detail::mpi_watch* const ww = whole.watch_.get();
  if (!ww || ww->ctl == MPI_COMM_NULL || ww->peers.size() != static_cast<std::size_t>(whole.size_))
    throw communication_error("loom::mpi_comm::watch_as_part_of: rank " + std::to_string(rank_) +
                              ": the whole communicator has no failure detector (call its watch_for_failures first)");
  MPI_Group mine = MPI_GROUP_NULL, theirs = MPI_GROUP_NULL;
  detail::check_mpi(MPI_Comm_group(comm_, &mine), "watch_as_part_of", rank_);
  detail::check_mpi(MPI_Comm_group(whole.comm_, &theirs), "watch_as_part_of", rank_);
  std::vector<int> ranks(static_cast<std::size_t>(size_)), in_whole(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) ranks[static_cast<std::size_t>(r)] = r;
  const int rc = MPI_Group_translate_ranks(mine, size_, ranks.data(), theirs, in_whole.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&theirs);
  detail::check_mpi(rc, "watch_as_part_of", rank_);
  auto w = std::make_shared<detail::mpi_watch>();
  for (int r = 0; r < size_; ++r) {
    const int t = in_whole[static_cast<std::size_t>(r)];
    if (t == MPI_UNDEFINED || t < 0 || t >= whole.size_)
      throw communication_error("loom::mpi_comm::watch_as_part_of: rank " + std::to_string(rank_) + ": rank " +
                                std::to_string(r) + " of this communicator is not a rank of the whole communicator");
    w->peers.push_back(ww->peers[static_cast<std::size_t>(t)]);
  }
  w->whole = whole.watch_;
  w->ctl = ww->ctl;  // whole's: looked at, never used for messages of this communicator
  w->generation = ww->generation;
  w->job_id = ww->job_id;
  w->deadline_s = 0;  // whole's
  watch_ = std::move(w);
}

LOOM_MPI_DECL void mpi_comm::replace_after_recovery(mpi_comm&& other) {
  // Kept for the program's life (never destroyed, so never MPI_Comm_free'd).
  static auto* abandoned = new std::vector<std::shared_ptr<const boost::mpi::communicator>>();
  abandoned->push_back(std::move(owner_));
  owner_ = std::move(other.owner_);
  comm_ = other.comm_;
  rank_ = other.rank_;
  size_ = other.size_;
  watch_ = std::move(other.watch_);
}

LOOM_MPI_DECL void mpi_comm::check_rank(const char* op, const char* what, int r) const {
  if (r < 0 || r >= size_)
    detail::throw_mpi(op, rank_, std::string(what) + " " + std::to_string(r) +
                                     " is not a rank of this communicator of " + std::to_string(size_));
}

LOOM_MPI_DECL std::string mpi_comm::count_mismatch(int want, int got, int peer, int tag) {
  return "expected " + std::to_string(want) + " elements from rank " + std::to_string(peer) + " with tag " +
         std::to_string(tag) + " but the message holds " + std::to_string(got);
}

LOOM_MPI_DECL void mpi_comm::request::wait() {
  if (watch_ && next_ < parts_.size()) return watched_wait();
  std::string error;
  for (; next_ < parts_.size(); ++next_) {
    MPI_Status status;
    const int rc = MPI_Wait(&parts_[next_].handle, &status);
    if (error.empty()) error = rc != MPI_SUCCESS ? detail::mpi_error_string(rc) : check(status, parts_[next_]);
  }
  parts_.clear();
  next_ = 0;
  if (!error.empty()) {
    then_ = nullptr;
    detail::throw_mpi(op_, rank_, error);
  }
  completed();
}

LOOM_MPI_DECL bool mpi_comm::request::test() {
  for (; next_ < parts_.size(); ++next_) {
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&parts_[next_].handle, &flag, &status);
    std::string error = rc != MPI_SUCCESS ? detail::mpi_error_string(rc) : std::string();
    if (error.empty() && flag == 0) return false;
    if (error.empty()) error = check(status, parts_[next_]);
    if (!error.empty()) {
      ++next_;
      try {
        wait();
      } catch (const communication_error&) {  // report the first error
      }
      detail::throw_mpi(op_, rank_, error);
    }
  }
  parts_.clear();
  next_ = 0;
  completed();
  return true;
}

LOOM_MPI_DECL std::string mpi_comm::request::check(const MPI_Status& status, const part& p) const {
  if (p.expected < 0) return {};
  int got = 0;
  MPI_Get_count(&status, type_, &got);
  return got == p.expected ? std::string() : count_mismatch(p.expected, got, p.from >= 0 ? p.from : peer_, tag_);
}

LOOM_MPI_DECL void mpi_comm::request::watched_wait() {
  std::vector<MPI_Request> rest;
  for (std::size_t i = next_; i < parts_.size(); ++i) rest.push_back(parts_[i].handle);
  std::vector<MPI_Status> st(rest.size());
  try {
    watch_->wait(static_cast<int>(rest.size()), rest.data(), st.data(), op_, rank_);
  } catch (...) {
    abandon();
    throw;
  }
  std::string error;
  for (std::size_t i = next_; i < parts_.size(); ++i)
    if (error.empty()) error = check(st[i - next_], parts_[i]);
  parts_.clear();
  next_ = 0;
  if (!error.empty()) {
    then_ = nullptr;
    detail::throw_mpi(op_, rank_, error);
  }
  completed();
}

}  // namespace loom
