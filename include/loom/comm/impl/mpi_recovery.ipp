// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of mpi_recovery.hpp's non-template functions: included at the end of
// loom/comm/mpi.hpp, which defines the communicator they work on (header-only), or compiled once in
// src/loom_mpi.cpp (loom::compiled_mpi, LOOM_SEPARATE_COMPILATION_MPI; see loom/core/config.hpp).

#include "loom/comm/mpi.hpp"

namespace loom::detail {

LOOM_MPI_DECL std::string read_small_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

LOOM_MPI_DECL std::string link_verdict(const std::filesystem::path& dir, const std::filesystem::path& final, const std::string& text,
                                       int rank, bool durable) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path tmp = dir / (final.filename().string() + ".rank-" + std::to_string(rank) + ".tmp");
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      throw communication_error("loom::recover_world: rank " + std::to_string(rank) + ": cannot write the verdict file " +
                                tmp.string() + ": " + std::strerror(errno) +
                                " (fault_options::verdict_dir must be a directory every rank can write)");
    std::size_t at = 0;
    while (at < text.size()) {
      const ssize_t k = ::write(fd, text.data() + at, text.size() - at);
      if (k <= 0) break;
      at += static_cast<std::size_t>(k);
    }
    if (durable) ::fsync(fd);
    ::close(fd);
  }
  const int rc = ::link(tmp.c_str(), final.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (rc != 0 && err != EEXIST)
    throw communication_error("loom::recover_world: rank " + std::to_string(rank) + ": cannot link the verdict " +
                              final.string() + ": " + std::strerror(err));
  return read_small_file(final);
}

}  // namespace loom::detail

namespace loom {

LOOM_MPI_DECL std::vector<long> fence_left_out(const mpi_comm& c, const recovery_result& res) {
  std::vector<long> fenced;
  const detail::mpi_watch* w = c.watch();
  if (!w || res.excluded) return fenced;
  const int me = c.rank();
  for (const int lost : res.lost) {
    const auto& peer = w->peers[static_cast<std::size_t>(lost)];
    int first_here = -1;  // the first member on its host (released ranks leave before the fencing)
    for (int m = 0; m < c.size() && first_here < 0; ++m)
      if (std::find(res.lost.begin(), res.lost.end(), m) == res.lost.end() &&
          std::find(res.released.begin(), res.released.end(), m) == res.released.end() &&
          w->peers[static_cast<std::size_t>(m)].host == peer.host)
        first_here = m;
    if (first_here == me && detail::runs_this_program(peer.pid) && ::kill(static_cast<pid_t>(peer.pid), SIGKILL) == 0)
      fenced.push_back(peer.pid);
  }
  return fenced;
}

}  // namespace loom

namespace loom::detail {

/// Messages of a later round than this rank's (a peer already in it), kept until this rank gets
/// there; and the buffers of this process's own sends, which must outlive them: one per
/// recovery, kept for the program's life.
struct recovery_mail {
  struct roll {
    MPI_Comm ctl;
    int from;
    roll_message message;
  };
  struct ready {
    MPI_Comm ctl;
    int from;
    std::uint64_t epoch;
  };
  std::vector<roll> early_roll;
  std::vector<ready> early_ready;
  std::vector<std::unique_ptr<roll_message>> sent_roll;
  std::vector<std::unique_ptr<std::uint64_t>> sent_ready;
};
inline recovery_mail& mail() {
  static recovery_mail m;
  return m;
}

/// One rank's view of a round of the protocol: the old communicator's detector, this rank and
/// its host, what it brings (q) and what the recovery decided so far (res).
struct recovery_round {
  mpi_watch& w;
  int n, me;
  std::string my_host;
  const recovery_request& q;
  recovery_result& res;

  local_evidence evidence(int r) const { return evidence_of(w.peers[static_cast<std::size_t>(r)], my_host); }
};

/// 1. The roll call: sends this rank's state to every rank on the control communicator and
/// listens for the others' until every rank answered, or the window passed — a silent peer on
/// this host is looked at: a process that is gone or stopped will not answer (no need to wait
/// for it), one that runs is only slow (it is waited for up to four windows). Fills
/// res.roll_call; returns who was heard.
LOOM_MPI_DECL std::vector<bool> take_roll_call(recovery_round& round) {
  using clock = std::chrono::steady_clock;
  mpi_watch& w = round.w;
  const int n = round.n, me = round.me;
  const auto round_start = clock::now();
  roll_message mine;
  mine.generation = w.generation;
  mine.committed_step = round.q.committed_step;
  mine.last_step = w.last_done.step;
  mine.last_phase = static_cast<std::uint8_t>(w.last_done.phase);
  mine.last_bucket = w.last_done.bucket;
  mine.now_step = fault_state.here.step;
  mine.now_phase = static_cast<std::uint8_t>(fault_state.here.phase);
  mine.now_bucket = fault_state.here.bucket;
  std::snprintf(mine.last_op, sizeof mine.last_op, "%s", w.last_op);
  mail().sent_roll.push_back(std::make_unique<roll_message>(mine));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    MPI_Request r;
    if (MPI_Isend(mail().sent_roll.back().get(), sizeof mine, MPI_BYTE, p, recovery_tag, w.ctl, &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
  }
  std::vector<bool> heard(static_cast<std::size_t>(n), false);
  std::vector<roll_message> got(static_cast<std::size_t>(n));
  heard[static_cast<std::size_t>(me)] = true;
  got[static_cast<std::size_t>(me)] = mine;
  int count = 1;
  for (const auto& e : mail().early_roll)
    if (e.ctl == w.ctl && e.message.generation == w.generation && !heard[static_cast<std::size_t>(e.from)]) {
      heard[static_cast<std::size_t>(e.from)] = true;
      got[static_cast<std::size_t>(e.from)] = e.message;
      ++count;
    }
  auto next_look = clock::now();
  while (count < n) {
    const double waited = std::chrono::duration<double>(clock::now() - round_start).count();
    if (clock::now() >= next_look) {
      next_look = clock::now() + std::chrono::milliseconds(5);
      bool wait_more = false;
      for (int p = 0; p < n && !wait_more; ++p) {
        if (heard[static_cast<std::size_t>(p)]) continue;
        const local_evidence e = round.evidence(p);
        if (e == local_evidence::alive) wait_more = waited < 4 * round.q.window_s;
        else if (e == local_evidence::unknown) wait_more = waited < round.q.window_s;
      }
      if (!wait_more) break;
    }
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, recovery_tag, w.ctl, &flag, &st);
    if (!flag) {
      sched_yield();
      continue;
    }
    roll_message m;
    MPI_Recv(&m, sizeof m, MPI_BYTE, st.MPI_SOURCE, recovery_tag, w.ctl, MPI_STATUS_IGNORE);
    const auto src = static_cast<std::size_t>(st.MPI_SOURCE);
    if (m.generation == w.generation && !heard[src]) {
      heard[src] = true;
      got[src] = m;
      ++count;
    } else if (m.generation > w.generation) {
      mail().early_roll.push_back({w.ctl, static_cast<int>(src), m});  // a peer already in a later round
    }
  }
  for (int r = 0; r < n; ++r) {
    const auto& m = got[static_cast<std::size_t>(r)];
    const auto& peer = w.peers[static_cast<std::size_t>(r)];
    round.res.roll_call.push_back({.rank = r, .world_rank = peer.world_rank, .pid = peer.pid, .host = peer.host,
                                   .answered = heard[static_cast<std::size_t>(r)], .committed_step = m.committed_step,
                                   .last_op = m.last_op,
                                   .last_done = {m.last_step, static_cast<fault_phase>(m.last_phase), m.last_bucket},
                                   .now = {m.now_step, static_cast<fault_phase>(m.now_phase), m.now_bucket}});
  }
  return heard;
}

/// 2. The verdict: the ranks heard from (less those gone by now, on this host) are this rank's
/// proposal; the first proposal linked in the shared directory is everyone's. Fills res.lost,
/// res.verdict, res.verdict_by, and for groups that go on only whole (a hybrid's replicas,
/// recovery_request::group_size) res.released and res.no_whole_group. Returns the members: the
/// ranks that go on.
LOOM_MPI_DECL std::vector<int> agree_on_verdict(recovery_round& round, std::vector<bool> heard) {
  const int n = round.n, me = round.me;
  recovery_result& res = round.res;
  for (int r = 0; r < n; ++r)
    if (r != me && heard[static_cast<std::size_t>(r)] && round.evidence(r) == local_evidence::gone)
      heard[static_cast<std::size_t>(r)] = false;
  std::string proposal = "members";
  for (int r = 0; r < n; ++r)
    if (heard[static_cast<std::size_t>(r)]) proposal += " " + std::to_string(r);
  proposal += "\nby " + std::to_string(me) + "\nworld_ranks";
  for (int r = 0; r < n; ++r)
    if (heard[static_cast<std::size_t>(r)]) proposal += " " + std::to_string(round.w.peers[static_cast<std::size_t>(r)].world_rank);
  proposal += "\n";
  const std::filesystem::path dir = round.q.verdict_dir / ("job-" + round.w.job_id);
  res.verdict = dir / ("epoch-" + std::to_string(res.epoch));
  const std::string verdict = link_verdict(dir, res.verdict, proposal, me);
  std::vector<int> members;
  {
    std::istringstream in(verdict);
    std::string word;
    in >> word;  // "members"
    int r = 0;
    while (in >> r) members.push_back(r);
    in.clear();
    in >> word >> res.verdict_by;  // "by"
  }
  if (members.empty() || std::any_of(members.begin(), members.end(), [n](int r) { return r < 0 || r >= n; }))
    throw communication_error("loom::recover_world: rank " + std::to_string(me) + ": the verdict " + res.verdict.string() +
                              " is not one this job wrote (expected 'members <ranks of 0.." + std::to_string(n - 1) +
                              ">', found '" + verdict.substr(0, 80) + "')");
  for (int r = 0; r < n; ++r)
    if (std::find(members.begin(), members.end(), r) == members.end()) res.lost.push_back(r);
  // Groups that go on only whole (a hybrid's replicas): a member whose group lost a rank is
  // released. Every member derives the same from the same verdict.
  if (round.q.group_size > 1) {
    const int g = round.q.group_size;
    std::vector<int> whole;
    for (const int m : members) {
      const int first = m / g * g;
      bool complete = first + g <= n;
      for (int k = first; complete && k < first + g; ++k)
        complete = std::find(members.begin(), members.end(), k) != members.end();
      (complete ? whole : res.released).push_back(m);
    }
    members = std::move(whole);
    res.no_whole_group = members.empty();
  }
  return members;
}

/// Ready: every member tells the others it is about to rebuild, and waits until every member
/// said so — one that does not (gone, or silent for the window) makes the next round. So a
/// member that dies between the roll call and the rebuild is left out by the next verdict
/// instead of blocking MPI_Comm_create_group; only a death within the microseconds between its
/// last ready message and the rebuild still can (the watchdog's case). Returns whether every
/// member said ready.
LOOM_MPI_DECL bool exchange_ready(recovery_round& round, const std::vector<int>& members) {
  using clock = std::chrono::steady_clock;
  mpi_watch& w = round.w;
  const int me = round.me;
  const std::uint64_t epoch = round.res.epoch;
  mail().sent_ready.push_back(std::make_unique<std::uint64_t>(epoch));
  for (const int m : members) {
    if (m == me) continue;
    MPI_Request r;
    if (MPI_Isend(mail().sent_ready.back().get(), 1, MPI_UINT64_T, m, recovery_tag + 1, w.ctl, &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
  }
  std::vector<bool> ready(static_cast<std::size_t>(round.n), false);
  auto is_member = [&](int r) { return std::find(members.begin(), members.end(), r) != members.end(); };
  ready[static_cast<std::size_t>(me)] = true;
  std::size_t have = 1;
  for (const auto& e : mail().early_ready)
    if (e.ctl == w.ctl && e.epoch == epoch && is_member(e.from) && !ready[static_cast<std::size_t>(e.from)]) {
      ready[static_cast<std::size_t>(e.from)] = true;
      ++have;
    }
  const auto ready_start = clock::now();
  auto look = ready_start;
  while (have < members.size()) {
    if (clock::now() >= look) {
      look = clock::now() + std::chrono::milliseconds(5);
      const double waited = std::chrono::duration<double>(clock::now() - ready_start).count();
      for (const int m : members) {
        if (ready[static_cast<std::size_t>(m)]) continue;
        const local_evidence e = round.evidence(m);
        if (e == local_evidence::gone || e == local_evidence::stopped) return false;
        if (e == local_evidence::alive && waited >= 4 * round.q.window_s) return false;
        if (e == local_evidence::unknown && waited >= round.q.window_s) return false;
      }
    }
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, recovery_tag + 1, w.ctl, &flag, &st);
    if (!flag) {
      sched_yield();
      continue;
    }
    std::uint64_t got = 0;
    MPI_Recv(&got, 1, MPI_UINT64_T, st.MPI_SOURCE, recovery_tag + 1, w.ctl, MPI_STATUS_IGNORE);
    const auto src = static_cast<std::size_t>(st.MPI_SOURCE);
    if (got == epoch && is_member(st.MPI_SOURCE) && !ready[src]) {
      ready[src] = true;
      ++have;
    } else if (got > epoch) {
      mail().early_ready.push_back({w.ctl, st.MPI_SOURCE, got});
    }
  }
  return true;
}

/// The round's outcome, decided once for every member: the first decision linked as
/// epoch-<e>.decision is everyone's. Each member decides alone otherwise, and two can disagree
/// — one saw a member's ready before that member died, another looked at the dead process
/// before reading its ready (or it died between its two sends) — and then one goes on to the
/// rebuild, where it blocks, while the other starts the next round and leaves the blocked one
/// out as silent (a live survivor lost; fault_trials.sh `during`). A member proposes "go" only
/// if every member said ready and none is gone or stopped now. Returns whether the round goes
/// on to the rebuild.
LOOM_MPI_DECL bool decide_round(recovery_round& round, const std::vector<int>& members, bool all_ready) {
  bool go = all_ready;
  for (const int m : members)
    if (go && m != round.me) {
      const local_evidence e = round.evidence(m);
      if (e == local_evidence::gone || e == local_evidence::stopped) go = false;
    }
  const std::filesystem::path dir = round.q.verdict_dir / ("job-" + round.w.job_id);
  const std::filesystem::path decision = dir / ("epoch-" + std::to_string(round.res.epoch) + ".decision");
  const std::string outcome = link_verdict(dir, decision, go ? "go\n" : "retry\n", round.me, /*durable=*/false);
  if (outcome.rfind("go", 0) == 0) return true;
  if (outcome.rfind("retry", 0) != 0)
    throw communication_error("loom::recover_world: rank " + std::to_string(round.me) + ": the decision " + decision.string() +
                              " is not one this job wrote (expected 'go' or 'retry', found '" + outcome.substr(0, 80) +
                              "')");
  return false;
}

/// 3. The survivors' communicator: MPI_Comm_create_group over the members (collective over them
/// only) and a new control communicator, with the old detector's peers, job and deadline and the
/// new epoch; c takes them. A member that dies inside it blocks it: the watchdog ends this
/// process after rebuild_timeout_s (status 75).
LOOM_MPI_DECL void rebuild_world(mpi_comm& c, recovery_round& round, const std::vector<int>& members) {
  const int me = round.me;
  deadline_watchdog watchdog(round.q.rebuild_timeout_s, "recovery: rank " + std::to_string(me) +
                                                            ": the survivors' communicator (a survivor died while it was built)");
  MPI_Group old_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(c.native(), &old_group);
  MPI_Group_incl(old_group, static_cast<int>(members.size()), members.data(), &group);
  MPI_Comm nc = MPI_COMM_NULL;
  const int tag = static_cast<int>(1000 + round.res.epoch % 30000);
  check_mpi(MPI_Comm_create_group(c.native(), group, tag, &nc), "recover_world", me);
  MPI_Group_free(&group);
  MPI_Group_free(&old_group);
  mpi_comm fresh = mpi_comm::attach(nc, true);
  auto nw = std::make_shared<mpi_watch>();
  check_mpi(MPI_Comm_dup(nc, &nw->ctl), "recover_world", me);
  MPI_Comm_set_errhandler(nw->ctl, MPI_ERRORS_RETURN);
  for (const int m : members) nw->peers.push_back(round.w.peers[static_cast<std::size_t>(m)]);
  nw->job_id = round.w.job_id;
  nw->generation = round.res.epoch;
  nw->deadline_s = round.w.deadline_s;
  fresh.attach_watch(std::move(nw));
  c.replace_after_recovery(std::move(fresh));
}

}  // namespace loom::detail

namespace loom {

LOOM_MPI_DECL recovery_result recover_world(mpi_comm& c, const recovery_request& q) {
  using clock = std::chrono::steady_clock;
  detail::mpi_watch* w = c.watch();
  if (!w) throw communication_error("loom::recover_world: failure detection is off on this communicator (watch_for_failures)");
  const auto t0 = clock::now();
  recovery_result res;
  res.old_rank = c.rank();
  res.old_size = c.size();
  res.epoch = w->generation + 1;
  // Before the roll call, whose messages take the same TCP endpoints as training's.
  detail::restore_event_polling_after_failure();
  detail::recovery_round round{*w, c.size(), c.rank(), w->peers[static_cast<std::size_t>(c.rank())].host, q, res};
  // Rounds of the protocol: a member that is gone (this host) before the rebuild starts makes the
  // next epoch's round, so that no survivor waits for it inside MPI_Comm_create_group.
  std::vector<int> members;
  for (;;) {
    members = detail::agree_on_verdict(round, detail::take_roll_call(round));
    res.agree_s = std::chrono::duration<double>(clock::now() - t0).count();
    res.excluded = std::find(members.begin(), members.end(), round.me) == members.end();
    if (res.excluded) break;
    if (detail::decide_round(round, members, detail::exchange_ready(round, members))) break;
    w->generation = res.epoch;
    res.epoch = w->generation + 1;
    res.roll_call.clear();
    res.lost.clear();
    res.released.clear();
  }
  if (res.excluded || !q.rebuild) return res;
  detail::fault_state.recovered = true;
  res.fenced = fence_left_out(c, res);
  const auto t1 = clock::now();
  detail::rebuild_world(c, round, members);
  res.rebuild_s = std::chrono::duration<double>(clock::now() - t1).count();
  res.new_rank = c.rank();
  res.new_size = c.size();
  return res;
}

}  // namespace loom

namespace loom::detail {

LOOM_MPI_DECL std::vector<std::string> own_arguments() {
  std::vector<std::string> args;
  const std::string all = read_small_file("/proc/self/cmdline");
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (!args.empty()) args.erase(args.begin());
  return args;
}

}  // namespace loom::detail

namespace loom {

LOOM_MPI_DECL replacement_spawn spawn_replacements(mpi_comm& c, const std::vector<std::string>& hosts, double timeout_s) {
  using clock = std::chrono::steady_clock;
  replacement_spawn out;
  const auto t0 = clock::now();
  const int me = c.rank();
  MPI_Comm bridge = MPI_COMM_NULL;
  std::uint64_t status[2] = {0, 0};  // ok, MPI error code
  std::string why;
  if (me == 0) {
    std::error_code ec;
    out.command = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    std::vector<std::string> args = detail::own_arguments();
    // LOOM_REPLACE_EXTRA_ARG: one more argument for the newcomers (tests: one that changes
    // the job, which the survivors must refuse).
    if (const char* extra = std::getenv("LOOM_REPLACE_EXTRA_ARG"); extra && *extra) args.emplace_back(extra);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int k = static_cast<int>(hosts.size());
    std::vector<char*> commands(static_cast<std::size_t>(k), const_cast<char*>(out.command.c_str()));
    std::vector<char**> argvs(static_cast<std::size_t>(k), argv.data());
    std::vector<int> procs(static_cast<std::size_t>(k), 1), codes(static_cast<std::size_t>(k), MPI_SUCCESS);
    std::vector<MPI_Info> infos(static_cast<std::size_t>(k), MPI_INFO_NULL);
    const std::string cwd = std::filesystem::current_path(ec).string();
    // LOOM_REPLACE_HOST: the host every newcomer is asked for (tests: a host not in the
    // allocation makes the runtime refuse).
    const char* forced = std::getenv("LOOM_REPLACE_HOST");
    for (int i = 0; i < k; ++i) {
      MPI_Info_create(&infos[static_cast<std::size_t>(i)]);
      const std::string host = forced && *forced ? std::string(forced) : hosts[static_cast<std::size_t>(i)];
      if (!host.empty()) MPI_Info_set(infos[static_cast<std::size_t>(i)], "host", host.c_str());
      if (!cwd.empty()) MPI_Info_set(infos[static_cast<std::size_t>(i)], "wdir", cwd.c_str());
    }
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm inter = MPI_COMM_NULL;
    int rc = MPI_SUCCESS;
    {
      detail::deadline_watchdog watchdog(timeout_s, "replacement: starting the replacement processes (MPI_Comm_spawn_multiple)");
      rc = MPI_Comm_spawn_multiple(k, commands.data(), argvs.data(), procs.data(), infos.data(), 0, MPI_COMM_SELF,
                                   &inter, codes.data());
    }
    for (auto& i : infos) MPI_Info_free(&i);
    out.spawn_s = std::chrono::duration<double>(clock::now() - t0).count();
    if (rc == MPI_SUCCESS)
      for (const int code : codes)
        if (code != MPI_SUCCESS) rc = code;
    if (rc == MPI_SUCCESS) {
      MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
      detail::deadline_watchdog watchdog(timeout_s, "replacement: the merge with the replacement processes");
      rc = MPI_Intercomm_merge(inter, 0, &bridge);
      if (rc != MPI_SUCCESS) why = "MPI_Intercomm_merge with them failed: " + detail::mpi_error_string(rc);
    } else {
      why = "MPI_Comm_spawn_multiple of " + out.command + " failed: " + detail::mpi_error_string(rc);
    }
    status[0] = rc == MPI_SUCCESS;
    status[1] = static_cast<std::uint64_t>(rc);
  }
  {
    // The others wait for rank 0's spawn (0.3 s measured, more on a loaded host) longer than
    // a step-derived deadline may be.
    const double deadline = c.watch() ? c.watch()->deadline_s : 0;
    c.set_deadline(std::max(deadline, timeout_s));
    try {
      c.broadcast(status, 2, 0);
    } catch (...) {
      c.set_deadline(deadline);
      throw;
    }
    c.set_deadline(deadline);
  }
  if (!status[0]) {
    out.why = me == 0 ? why : "rank 0 could not start them: " + detail::mpi_error_string(static_cast<int>(status[1]));
    return out;
  }
  const auto t1 = clock::now();
  {
    detail::deadline_watchdog watchdog(timeout_s, "replacement: the survivors' merge with the replacement processes");
    MPI_Comm inter = MPI_COMM_NULL;
    detail::check_mpi(MPI_Intercomm_create(c.native(), 0, me == 0 ? bridge : MPI_COMM_NULL, 1,
                                           detail::replacement_tag, &inter),
                      "spawn_replacements (MPI_Intercomm_create)", me);
    MPI_Comm world = MPI_COMM_NULL;
    detail::check_mpi(MPI_Intercomm_merge(inter, 0, &world), "spawn_replacements (MPI_Intercomm_merge)", me);
    out.world = std::make_shared<mpi_comm>(mpi_comm::attach(world));
  }
  out.merge_s = std::chrono::duration<double>(clock::now() - t1).count();
  if (me != 0) out.spawn_s = std::chrono::duration<double>(t1 - t0).count();
  out.ok = true;
  return out;
}

}  // namespace loom
