// SPDX-License-Identifier: Apache-2.0
#pragma once
// The trainer's side of a failed rank (docs/fault-tolerance.md): failure detection over a fit
// and its deadlines, with the loop that retries the fit after each recovery
// (detail::failure_watch, a step observer); the survivors' recovery (loom::recover_world, the
// roll call, the state of the survivor ahead), the replacement of lost ranks
// (fault_options::replace), the handshake of a replacement, and the emergency checkpoint when
// nothing can recover. Written once for every trainer: the engine comes in erased
// (detail::erased_engine), so that the protocol is compiled once per communicator type
// (loom::mpi_comm, loom::nccl_comm) and the rest once per program — not once per trainer type.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/open_mpi.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/step_observer.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/data/data_parallel.hpp"  // job_field_diff
#include "loom/train/erased_engine.hpp"
#include "loom/train/fit_options.hpp"
#include "loom/train/run_state.hpp"

namespace loom {
namespace detail {

LOOM_DECL std::string fmt_seconds(double s);

/// The deadline of the collectives under failure detection: fault_options::deadline_s, or
/// deadline_steps times the median of the last 16 step times (at least floor_s), and
/// startup_deadline_s until 4 steps are measured.
class step_clock {
 public:
  step_clock(const fault_options& f, double floor_s) : f_(f), floor_s_(floor_s) {}
  /// The least step-derived deadline.
  void set_floor(double floor_s) noexcept { floor_s_ = floor_s; }
  /// Adds a step's time; returns the deadline now.
  double add(double s) {
    times_[n_++ % times_.size()] = s;
    return deadline();
  }
  double deadline() const {
    if (f_.deadline_s > 0) return f_.deadline_s;
    const std::size_t k = std::min(n_, times_.size());
    if (k < 4) return f_.startup_deadline_s;
    std::array<double, 16> t = times_;
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(k / 2), t.begin() + static_cast<std::ptrdiff_t>(k));
    return std::max(floor_s_, f_.deadline_steps * t[k / 2]);
  }
  /// Adds a checkpoint's times: how long this rank spent in it (`here_s`: its collectives,
  /// waiting for the previous one to finish, writing when it is not asynchronous), and the
  /// writers' job-wide time of the last checkpoint completed (io::checkpointer::last_seconds,
  /// 0 before one completed).
  void add_checkpoint(double here_s, double job_s) {
    checkpoint_s_ = std::max({checkpoint_s_, here_s, job_s});
    if (job_s > 0) checkpoint_measured_ = true;
  }
  /// The deadline of a checkpoint's collectives: a checkpoint takes longer than a step on the
  /// rank that writes the most, and its peers wait for that rank. Until a checkpoint has
  /// completed and its time is known, startup_deadline_s; then deadline_steps times the
  /// longest checkpoint seen, at least min_checkpoint_deadline_s (a write's time on shared
  /// storage varies far more than a step's); never less than the step deadline.
  double checkpoint_deadline() const {
    if (!checkpoint_measured_) return std::max(deadline(), f_.startup_deadline_s);
    return std::max({deadline(), f_.min_checkpoint_deadline_s, f_.deadline_steps * checkpoint_s_});
  }
  /// After a recovery: the step times are measured again (new batch shapes); the checkpoint
  /// times are kept (deadline_steps covers a writer's larger share on fewer ranks).
  void restart() { n_ = 0; }

 private:
  const fault_options& f_;
  double floor_s_;
  std::array<double, 16> times_{};
  std::size_t n_ = 0;
  double checkpoint_s_ = 0;
  bool checkpoint_measured_ = false;
};

/// The run's place, the optimizer's step count, the parameters and the optimizer buffers of
/// rank root to every rank of the engine's world `comm` (collective); and root's EMA of the
/// weights where the run keeps one (survivors may be a step apart: the EMA goes with the state).
template <class Comm>
void broadcast_run(Comm& comm, erased_engine& e, run_state& s, int root) {
  if (s.ema.on()) {
    double head[2] = {static_cast<double>(s.ema.updates), s.ema.valid ? 1.0 : 0.0};
    comm.broadcast(head, 2, root);
    s.ema.updates = static_cast<std::size_t>(head[0]);
    s.ema.valid = head[1] != 0;
    comm.broadcast(s.ema.values.data(), s.ema.values.size(), root);
  }
  std::array<double, run_head::values> v =
      run_head{.step = s.step, .optimizer_steps = e.optimizer_steps(), .at = s.at, .lr = s.last_lr}.pack();
  comm.broadcast(v.data(), v.size(), root);
  const run_head h = run_head::unpack(v);
  s.step = h.step;
  e.set_optimizer_steps(h.optimizer_steps);
  s.at = h.at;
  s.last_lr = h.lr;
  e.broadcast_state(root);
}

/// Whether a recovery over Comm can also merge new processes in (fault_options::replace): the
/// spawn, the merge and the newcomers' detector are loom::mpi_comm's.
template <class Comm>
inline constexpr bool can_spawn_replacements = requires(Comm& c, const std::vector<std::string>& hosts) {
  spawn_replacements(c, hosts, 1.0);
  c.watch_deadlines_only(1.0);
};

/// A rank of a roll call, as the reports name it.
LOOM_DECL std::string recovery_who(const recovery_roll_entry& e);

/// The ranks a recovery left out, named.
LOOM_DECL std::string recovery_lost(const recovery_result& res);

/// The roll call of a recovery, a line per rank of the old communicator.
LOOM_DECL std::string recovery_roll(const recovery_result& res, double window);

/// This rank was left out by the verdict of a recovery: it says so and leaves (status 0: the
/// job goes on without it).
[[noreturn]] inline void leave_after_verdict(int number, int old_rank, const recovery_result& res, const std::string& roll) {
  std::fprintf(stderr,
               "loom: recovery %d: rank %d was left out by the verdict %s (the others did not hear from it in "
               "time): this process leaves the job, which goes on without it. Roll call:%s\n",
               number, old_rank, res.verdict.c_str(), roll.c_str());
  std::fflush(stderr);
  write_exit_status("left");
  std::_Exit(0);
}

/// Every model replica of a hybrid lost a rank in one failure (no_whole_replica_left): a
/// rank_failure that no recovery can mend, so fit's loop lets it out.
struct no_replica_left : rank_failure {
  using rank_failure::rank_failure;
};

/// This rank's replica lost a rank in the verdict of a recovery (recovery_request::group_size):
/// the replica cannot go on, and the others train without it; this process says so and leaves
/// (status 0).
[[noreturn]] inline void leave_with_replica(int number, int old_rank, const recovery_result& res, const std::string& roll) {
  std::fprintf(stderr,
               "loom: recovery %d: rank %d leaves the job with its model replica, which lost %s; the other replicas go "
               "on without it. Roll call:%s\n",
               number, old_rank, recovery_lost(res).c_str(), roll.c_str());
  std::fflush(stderr);
  write_exit_status("left");
  std::_Exit(0);
}

/// Every model replica of a hybrid lost a rank: no survivor holds a whole replica, so the job
/// ends (loomrun restarts it from the newest checkpoint). The first survivor prints the roll
/// call; every survivor throws.
[[noreturn]] inline void no_whole_replica_left(int number, int old_rank, std::size_t step, const recovery_result& res,
                                               const rank_failure& f, const std::string& roll) {
  const std::string lost = recovery_lost(res);
  if (!res.released.empty() && res.released.front() == old_rank)
    std::fprintf(stderr, "loom: recovery %d at step %zu: lost %s: every model replica lost a rank and none is whole; "
                 "the job ends. Roll call:%s\nloom: resume from the newest checkpoint (loomrun restarts the job by "
                 "itself, on the ranks and hosts left)\n", number, step, lost.c_str(), roll.c_str());
  std::fflush(stderr);
  throw no_replica_left(f.why(), f.operation(), f.waited_s(), f.peer(), "loom::trainer::fit: rank " + std::to_string(old_rank) + ": the job ends at step " +
                      std::to_string(step) + ": lost " + lost + " and with them a rank of every model replica; resume " +
                      "from the newest checkpoint (" + f.what() + ")");
}

/// Failure detection over one fit (docs/fault-tolerance.md), a step observer: it turns the
/// detection on where the engine and the run allow it (a replacement of a lost rank joins the
/// survivors here), keeps the collectives' deadline at the one the step times give (and the
/// checkpoints' around a checkpoint), reports a recovery once the first step after it is good,
/// and runs the fit again after each failure it survives (run).
class failure_watch final : public step_observer {
 public:
  /// Failure detection as opts.fault asks, where the engine can: recovery (e.caps.recovers),
  /// or a roll call before the job ends (e.caps.detects); under neither, the communicators'
  /// shared deadline where the runtime keeps survivors alive. `joining`: this process replaces
  /// a lost rank (its first fit joins the survivors and takes their state: s.resume). `writer`:
  /// the trainer's checkpoint writer, made by its first checkpoint (a recovery gives up the
  /// checkpoint in flight).
  LOOM_DECL failure_watch(erased_engine& e, run_state& s, const fit_options& opts, bool joining,
                          const std::unique_ptr<io::checkpointer>& writer);

  /// Failure detection is on (the survivors of a failure may go on).
  bool watching() const noexcept { return s_.watching; }
  /// A failure is survived in the process (failure detection, and a runtime that keeps the
  /// survivors alive).
  bool recovering() const noexcept { return recovering_; }

  /// The deadline from the step's time; the last recovery's report once this step is good.
  LOOM_DECL bool after_step(const step_point& p) override;
  /// The step times are measured anew (new batch shapes); the checkpoints' are kept.
  LOOM_DECL void after_recovery() override;

  /// A checkpoint's collectives have a deadline of their own: checkpoint_begins() sets it,
  /// checkpoint_ended(here_s, job_s) adds the checkpoint's times (this rank's in it; the
  /// writers' job-wide, io::checkpointer::last_seconds) and sets the step deadline again.
  LOOM_DECL void checkpoint_begins();
  LOOM_DECL void checkpoint_ended(double here_s, double job_s);
  /// The previous checkpoint's job-wide time, known once it completed (wait() inside this
  /// checkpoint, job_s > 0): the rest of this checkpoint's collectives take the deadline derived
  /// from it instead of startup_deadline_s. (Without it the second checkpoint ran wholly under the
  /// 60 s startup deadline, longer than loomrun's --recovery-timeout: a host lost during it was
  /// restarted from the checkpoint instead of recovered in the process.)
  LOOM_DECL void checkpoint_measured(double job_s);

  /// Runs attempt(from); after each rank_failure, the recovery — the survivors agree, rebuild
  /// and take the state of the one ahead (detail::survive) — then reshard() (the data dealt over
  /// the world as it is now), the observers' after_recovery, and attempt again from where the
  /// survivors are. A failure not survived ends the job: the roll call where the engine
  /// detects, else `emergency()` (an emergency checkpoint where one is due), and the failure
  /// goes on up. Returns the recoveries.
  LOOM_DECL int run(const fit_position& from, step_observers& observers,
                    const std::function<void(const fit_position&)>& attempt, const std::function<void()>& reshard,
                    const std::function<void()>& emergency);

  /// After the fit: the verdicts of a job that recovered are history (rank 0 removes them).
  LOOM_DECL void end(int recoveries);

 private:
  void set_deadline(double d);
  fit_position survive_failure(const rank_failure& first, int& recoveries);

  erased_engine& e_;
  run_state& s_;
  const fit_options& opts_;
  const std::unique_ptr<io::checkpointer>& writer_;
  bool detecting_ = false, recovering_ = false, shared_deadlines_ = false;
  step_clock steps_timed_;
  std::string report_;  // the last recovery's, printed once the first step after it is good
  monitor::clock::time_point failure_seen_{};
};

/// Rank 0's warning when fault_options::replace is on but no recovery runs in this fit.
LOOM_DECL void warn_replace_without_recovery(const fault_options& fo, bool watching);

/// The line a recovery prints once the first step after it is good.
LOOM_DECL std::string recovery_report(int number, std::size_t step, const recovery_result& res, const rank_failure& f,
                                      const fault_marker& failed_at, int root, std::size_t behind, double exchange_s,
                                      const std::string& roll);

/// The handshake of the survivors and their replacements over m (survivors first; both sides
/// call it, in this order): rank 0 sends the job id, the membership epoch and its job's
/// description, each newcomer compares it with its own (`joined`), and all learn whether every
/// newcomer runs the same job; on a match m gets its failure detector (collective) with the
/// survivors' job id and epoch. `world` is the survivors' communicator (unused on a newcomer).
/// Waits at most replace_timeout_s for the newcomers (a rank_failure otherwise). Returns the
/// fields a newcomer found different (empty: the same job; on a newcomer, its own findings).
template <class Comm>
std::string join_exchange(Comm& m, Comm& world, bool newcomer, const fault_options& fo, const std::string& joined) {
  m.watch_deadlines_only(fo.replace_timeout_s);
  std::string text;
  if (!newcomer) {
    const auto* w = world.watch();
    text = w->job_id + "\n" + std::to_string(w->generation) + "\n" + joined;
  }
  std::uint64_t len = text.size();
  m.broadcast(&len, 1, 0);
  text.resize(static_cast<std::size_t>(len));
  m.broadcast(text.data(), text.size(), 0);
  const std::size_t a = text.find('\n'), b = text.find('\n', a + 1);
  const std::string job_id = text.substr(0, a);
  const std::uint64_t generation = std::stoull(text.substr(a + 1, b - a - 1));
  const std::string theirs = text.substr(b + 1);
  std::string diff;
  if (newcomer && theirs != joined) {
    diff = job_field_diff(theirs, joined);
    if (diff.empty()) diff = " (the descriptions differ)";
  }
  std::uint64_t refused = diff.empty() ? 0 : 1;
  m.allreduce(&refused, 1, reduce_op::max);
  if (refused) return newcomer ? diff : std::string("refused");
  m.watch_for_failures(fo.startup_deadline_s);
  m.watch()->job_id = job_id;
  m.watch()->generation = generation;
  return {};
}

/// The survivors' side of fault_options::replace, after a recovery that lost ranks: start one
/// process per lost rank on its host (loom::spawn_replacements), join them (join_exchange), and
/// hand them the state. On success the world is back to its size before the failure, the
/// survivors with their ranks; otherwise the survivors go on as they are, and rank 0 says why.
/// Appends its report to `report`; sets `began` to when the spawn began on success.
template <class Comm>
void bring_replacements(Comm& comm, erased_engine& e, run_state& s, const recovery_result& res, const fault_options& fo,
                        int number, std::string& report) {
  const auto t0 = monitor::clock::now();
  std::vector<std::string> hosts;
  for (const int l : res.lost) hosts.push_back(res.roll_call[static_cast<std::size_t>(l)].host);
  const std::string lost = recovery_lost(res);
  auto give_up = [&](const std::string& why) {
    if (comm.rank() == 0)
      std::fprintf(stderr, "loom: replacement after recovery %d: no replacement for %s: %s; %d ranks go on\n", number,
                   lost.c_str(), why.c_str(), comm.size());
    std::fflush(stderr);
  };
  auto sp = spawn_replacements(comm, hosts, fo.replace_timeout_s);
  if (!sp.ok) return give_up(sp.why);
  auto merged = *sp.world;
  const auto t1 = monitor::clock::now();
  try {
    const std::string refused = join_exchange(merged, comm, /*newcomer=*/false, fo, s.joined_description);
    if (!refused.empty()) return give_up("the process started runs another job (it names the fields that differ on its stderr)");
  } catch (const rank_failure& e) {
    return give_up(std::string("it did not join within fault_options::replace_timeout_s: ") + e.what());
  }
  const int old_size = comm.size();
  comm.replace_after_recovery(std::move(merged));
  broadcast_run(comm, e, s, 0);
  const double join_s = monitor::seconds_between(t1, monitor::clock::now());
  s.replacement_began = t0;
  std::string joined;
  const auto& peers = comm.watch()->peers;
  for (int r = old_size; r < comm.size(); ++r)
    joined += (joined.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " (pid " +
               std::to_string(peers[static_cast<std::size_t>(r)].pid) + " on " + peers[static_cast<std::size_t>(r)].host + ")");
  char text[768];
  std::snprintf(text, sizeof text,
                "loom: replacement after recovery %d at step %zu: replaced %s by %s (%s, asked for host %s); %d ranks go on "
                "(were %d); spawn %.3f s, merge %.3f s, join (job check, detector, state) %.3f s",
                number, s.step, lost.c_str(), joined.c_str(), sp.command.c_str(), hosts.empty() ? "-" : hosts[0].c_str(),
                comm.size(), old_size, sp.spawn_s, sp.merge_s, join_s);
  report += std::string("\n") + text;
}

/// After a rank_failure under recovery: the survivors agree on who goes on and rebuild the
/// communicator (loom::recover_world), take the state of the survivor that finished the most
/// steps, and continue from its position with the same global batch shared by fewer ranks; with
/// fault_options::replace, they start processes for the lost ranks (bring_replacements). A rank
/// left out leaves the process (status 0: the job goes on without it). Returns the position to
/// continue from; sets `report` to the line printed after the first good step and
/// s.interrupted_lost to the ranks lost, as soon as they are known (reported if the state
/// exchange fails).
template <class Comm>
fit_position survive(Comm& comm, erased_engine& e, run_state& s, const rank_failure& f, const fault_options& fo,
                     const std::string& checkpoint_dir, int number, io::checkpointer* ckpt, std::string& report) {
  set_phase(fault_phase::recovery);
  const auto t0 = monitor::clock::now();
  const int replica_ranks = e.caps.replica_ranks;
  // The survivors wait in collectives, or compute for at most a step: they answer within a
  // deadline (at least 0.2 s; a silent peer on this host is looked at instead).
  const double window = std::max(0.2, comm.watch()->deadline_s);
  if (ckpt) ckpt->abandon();
  const std::size_t step = s.step;
  const recovery_request q{.committed_step = step, .window_s = window,
                           .verdict_dir = verdict_directory(fo, checkpoint_dir),
                           .rebuild_timeout_s = std::max(5.0, 4 * window), .group_size = replica_ranks};
  const int old_rank = comm.rank();
  const recovery_result res = recover_world(comm, q);
  const std::string roll = recovery_roll(res, window);
  if (res.no_whole_group) {
    recovery_result all = res;  // every survivor released: the first on a lost rank's host fences it
    all.excluded = false;
    all.released.clear();
    fence_left_out(comm, all);
    no_whole_replica_left(number, old_rank, step, res, f, roll);
  }
  if (res.excluded) {
    if (std::find(res.released.begin(), res.released.end(), old_rank) != res.released.end())
      leave_with_replica(number, old_rank, res, roll);
    leave_after_verdict(number, old_rank, res, roll);
  }
  s.interrupted_lost = recovery_lost(res);
  // The state of the survivor that finished the most steps (the first such): a rank whose
  // last allreduce finished holds a step the others had not taken yet. A hybrid's ranks that
  // are a step behind hold that step's reduced gradients (its commit completed somewhere) and
  // take it themselves, before after_recovery gives the gradients fresh memory.
  std::uint64_t most[2] = {step, 0};
  comm.allreduce(most, 1, reduce_op::max);
  const bool finished_here = most[0] == step + 1 && e.finish_committed_step();
  most[1] = step == most[0] ? static_cast<std::uint64_t>(comm.size() - comm.rank()) : 0;
  comm.allreduce(most + 1, 1, reduce_op::max);
  const int root = comm.size() - static_cast<int>(most[1]);
  if (replica_ranks > 1) {
    // Every rank of a hybrid must now be at the most advanced step: its slice's state is
    // taken from its own data-parallel group, where every replica has the same.
    const bool at_most = step == most[0] || finished_here;
    std::uint64_t behind = at_most ? 0 : 1;
    comm.allreduce(&behind, 1, reduce_op::max);
    if (behind)
      throw communication_error(
          "loom::trainer::fit: recovery " + std::to_string(number) + ": " +
          (at_most ? "a rank" : "rank " + std::to_string(comm.rank()) + " (step " + std::to_string(step) + ")") +
          " is behind the most advanced survivor (step " + std::to_string(most[0]) +
          ") without the committed gradients to catch up, so the replicas cannot agree on one state; resume from the "
          "newest checkpoint");
  }
  e.after_recovery();
  broadcast_run(comm, e, s, root);
  const fit_position p = s.at.next();
  report = recovery_report(number, s.step, res, f, s.failed_at, root, step,
                           monitor::seconds_between(t0, monitor::clock::now()) - res.agree_s - res.rebuild_s, roll);
  if (finished_here) {
    std::fprintf(stderr, "loom: recovery %d: rank %d (was %d) finished step %llu from its reduced gradients (the step's "
                 "commit had completed on another rank)\n", number, comm.rank(), old_rank,
                 static_cast<unsigned long long>(most[0]));
    std::fflush(stderr);
  }
  if constexpr (can_spawn_replacements<Comm>)
    if (fo.replace && !res.lost.empty() && replica_ranks == 1) bring_replacements(comm, e, s, res, fo, number, report);
  return p;
}

/// The report of a failure the job cannot go on from (end_after_failure): who was lost, why
/// the job ends, the wait that failed, the agreement's time and the roll call.
LOOM_DECL std::string failure_end_report(std::size_t step, const recovery_result& res, const rank_failure& f,
                                         const fault_marker& failed_at, const std::string& why, const std::string& roll);

/// After a rank_failure where no recovery is possible (fit_host::can_detect: a pipeline stage
/// or a tensor slice held once, the hybrids, sharded optimizer state): the ranks still running
/// take a roll call over comm (loom::recover_world without the rebuild: every rank's last
/// completed operation, and one verdict on who is lost, so that every rank names the same),
/// the first of them prints it, a survivor on a lost rank's host ends that process (a stopped
/// one would otherwise keep the job from ending), and every rank throws rank_failure saying
/// why the job ends: the launcher restarts it from the newest checkpoint. A SIGTERM (the
/// runtime is ending the job after a death) leaves no time for that: f is rethrown.
template <class Comm>
[[noreturn]] void end_after_failure(Comm& comm, const rank_failure& f, const fault_options& fo,
                                    const std::string& checkpoint_dir, std::size_t step, const fault_marker& failed_at,
                                    const std::string& why) {
  if (f.why() == rank_failure::kind::terminating) throw f;
  set_phase(fault_phase::recovery);
  // The ranks still running are blocked in a wait (which sees the roll call within a
  // millisecond) or compute for at most a step: a few seconds at most.
  const double window = std::clamp(comm.watch() ? comm.watch()->deadline_s : 1.0, 0.2, 5.0);
  const recovery_request q{.committed_step = step, .window_s = window,
                           .verdict_dir = verdict_directory(fo, checkpoint_dir),
                           .rebuild_timeout_s = std::max(5.0, 4 * window), .rebuild = false};
  const int me = comm.rank();
  recovery_result res;
  try {
    res = recover_world(comm, q);
  } catch (const communication_error& e) {
    throw rank_failure(f.why(), f.operation(), f.waited_s(), f.peer(),
                       std::string(f.what()) + "; the roll call after it failed: " + e.what());
  }
  const std::string roll = recovery_roll(res, window);
  const std::string lost = recovery_lost(res);
  if (res.excluded) {
    std::fprintf(stderr, "loom: rank %d was left out by the verdict %s (the others did not hear from it in time); the "
                 "job ends: %s. Roll call:%s\n", me, res.verdict.c_str(), why.c_str(), roll.c_str());
  } else {
    int first = 0;
    while (std::find(res.lost.begin(), res.lost.end(), first) != res.lost.end()) ++first;
    if (me == first) std::fprintf(stderr, "%s\n", failure_end_report(step, res, f, failed_at, why, roll).c_str());
  }
  std::fflush(stderr);
  fence_left_out(comm, res);
  throw rank_failure(f.why(), f.operation(), f.waited_s(), f.peer(),
                     "loom::trainer::fit: rank " + std::to_string(me) + ": the job ends at step " + std::to_string(step) +
                         ": " + (lost.empty() ? std::string("no rank lost (a deadline expired on a slow peer)") : "lost " + lost) +
                         "; " + why + "; resume from the newest checkpoint (" + f.what() + ")");
}

/// A replacement's first fit (fault_options::replace): joins the survivors waiting in their
/// recovery (join_exchange, then their state), and returns where to continue. A replacement
/// that runs another job, or that the survivors gave up on, says so and leaves (status 1).
template <class Comm>
fit_position join_as_replacement(Comm& comm, erased_engine& e, run_state& s, const fault_options& fo) {
  set_phase(fault_phase::recovery);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto leave = [&](const std::string& why) {
    std::fprintf(stderr, "loom: replacement: this process (pid %ld on %s) was started to replace a lost rank, and %s; "
                 "it leaves (status 1), and the survivors go on without it\n", static_cast<long>(::getpid()), host,
                 why.c_str());
    std::fflush(stderr);
    write_exit_status("failed 1");
    std::_Exit(1);
  };
  try {
    const std::string diff = join_exchange(comm, comm, /*newcomer=*/true, fo, s.joined_description);
    if (!diff.empty()) leave("it does not run the survivors' job:" + diff);
    broadcast_run(comm, e, s, 0);
  } catch (const rank_failure& e) {
    leave(std::string("the survivors did not complete its joining: ") + e.what());
  }
  fault_state.joining_as_replacement = false;
  e.after_recovery();  // fresh gradient buffers, as on the survivors
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "loom: replacement: this process (pid %ld on %s) joined as rank %d of %d at step %zu, %.3f s after "
               "it started MPI\n", static_cast<long>(::getpid()), host, comm.rank(), comm.size(), s.step,
               now - fault_state.replacement_started_unix);
  std::fflush(stderr);
  return s.at.next();
}

/// The first good step after a recovery: rank 0 prints the recovery's report (and the
/// replacement's, when one joined) with the time since the wait that failed began.
LOOM_DECL void report_first_good_step(int rank, int world, std::size_t step, const std::string& report,
                                      monitor::clock::time_point failure_seen, monitor::clock::time_point step_end,
                                      const std::optional<monitor::clock::time_point>& replacement_began);

/// When no recovery is possible: a survivor holding a whole replica writes the state after the
/// last step it finished as a checkpoint on its own (the first to claim the step does), so that
/// plain mpirun loses no step. `write` starts the checkpoint on the writer and collectives it is
/// given (solo). Never throws; says on stderr what it did.
LOOM_DECL void emergency_checkpoint(const std::string& directory, int rank, std::size_t step, io::checkpointer* ckpt,
                                    const std::function<void(io::checkpointer&, collectives&)>& write) noexcept;

}  // namespace detail
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/train/impl/recovery.ipp"
#endif
