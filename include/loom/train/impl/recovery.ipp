// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of recovery.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/train/recovery.hpp"

namespace loom::detail {

LOOM_DECL failure_watch::failure_watch(erased_engine& e, run_state& s, const fit_options& opts, bool joining,
                                       const std::unique_ptr<io::checkpointer>& writer)
    : e_(e), s_(s), opts_(opts), writer_(writer), steps_timed_(opts.fault, opts.fault.min_deadline_s) {
  const fault_options& fo = opts.fault;
  const bool several = e.world() > 1;
  const double first_deadline = fo.deadline_s > 0 ? fo.deadline_s : fo.startup_deadline_s;
  // Failure detection (deadlines on every collective), and recovery where the runtime keeps
  // the survivors alive: data parallelism, the hybrids' whole replicas (caps.recovers).
  s.watching = false;
  if (e.caps.recovers) {
    if (e.caps.replaces && joining) {
      s.resume = e.join_as_replacement(s, opts);  // the survivors' job check, detector and state
      s.watching = true;
    }
    if (!joining && fo.detect && several) {
      e.watch_for_failures(first_deadline);
      s.watching = true;
    }
  }
  // Where no recovery is possible (pipelines, tensor parallelism, the hybrids, sharded state):
  // deadlines on every communicator and, on a failure, a roll call before the job ends.
  detecting_ = e.caps.detects && fo.detect && several;
  if (detecting_) e.watch_for_failures(first_deadline);
  recovering_ = s.watching && (fo.recovery == recovery_mode::on ||
                               (fo.recovery == recovery_mode::automatic && runtime_keeps_survivors()));
  // A hybrid that recovers commits each step over the world (docs/fault-tolerance.md, "Hybrids").
  e.set_step_commit(recovering_);
  if (fo.replace && !recovering_ && e.rank() == 0 && several && !joining) warn_replace_without_recovery(fo, s.watching);
  steps_timed_.set_floor(recovering_ ? fo.min_deadline_s : std::max(fo.min_deadline_s, fo.min_deadline_without_recovery_s));
  // The communicators of a policy without a detector of its own (over a communicator other than
  // loom::mpi_comm) wait at most the step-derived deadline too, where the runtime keeps
  // survivors alive: a dead peer then ends the job (loomrun restarts it from its checkpoint)
  // instead of hanging it.
  shared_deadlines_ = !e.caps.recovers && !detecting_ && fo.detect && fault_state.shared_deadline_s > 0;
}

LOOM_DECL void failure_watch::set_deadline(double d) {
  if (shared_deadlines_) fault_state.shared_deadline_s = d;
  if (s_.watching || detecting_) e_.set_deadline(d);
}

LOOM_DECL bool failure_watch::after_step(const step_point& p) {
  if (shared_deadlines_ || s_.watching || detecting_) set_deadline(steps_timed_.add(monitor::seconds_between(p.started, p.ended)));
  if (s_.watching && !report_.empty()) {
    report_first_good_step(e_.rank(), e_.world(), p.step, report_, failure_seen_, p.ended, s_.replacement_began);
    report_.clear();
    s_.replacement_began.reset();
  }
  return true;
}

LOOM_DECL void failure_watch::after_recovery() {
  steps_timed_.restart();
  if (e_.caps.recovers) e_.set_deadline(steps_timed_.deadline());
}

// The checkpoint's collectives: the peers of the rank that writes the most wait for it (and
// for the previous checkpoint's writers). Every rank leaves a checkpoint after its last
// collective, and an asynchronous write goes on beside the steps without holding any
// collective of theirs: the next step has the step deadline.
LOOM_DECL void failure_watch::checkpoint_begins() { set_deadline(steps_timed_.checkpoint_deadline()); }
LOOM_DECL void failure_watch::checkpoint_ended(double here_s, double job_s) {
  steps_timed_.add_checkpoint(here_s, job_s);
  set_deadline(steps_timed_.deadline());
}
LOOM_DECL void failure_watch::checkpoint_measured(double job_s) {
  if (job_s <= 0) return;
  steps_timed_.add_checkpoint(0, job_s);
  set_deadline(steps_timed_.checkpoint_deadline());
}

LOOM_DECL int failure_watch::run(const fit_position& from, step_observers& observers,
                                 const std::function<void(const fit_position&)>& attempt,
                                 const std::function<void()>& reshard, const std::function<void()>& emergency) {
  fit_position at = from;
  for (int recoveries = 0;;) {
    try {
      attempt(at);
      return recoveries;
    } catch (const rank_failure& f) {
      s_.failed_at = fault_state.here;
      failure_seen_ = monitor::clock::now() - std::chrono::duration_cast<monitor::clock::duration>(
                                                  std::chrono::duration<double>(f.waited_s()));
      if (!recovering_) {
        if (detecting_ || e_.caps.ends_with_roll_call) e_.end_after_failure(s_, f, opts_);
        emergency();
        throw;
      }
      at = survive_failure(f, recoveries);
      reshard();
      observers.after_recovery();
    }
  }
}

LOOM_DECL fit_position failure_watch::survive_failure(const rank_failure& first, int& recoveries) {
  rank_failure f = first;
  // Reports of recoveries that another failure cut short go out with the next recovery's, by
  // the rank 0 after it: the rank 0 of the world they left may be the one that died.
  std::string earlier;
  // The last recovery's report waits for its first good step; a failure came first (two
  // failures close together).
  if (!report_.empty()) {
    earlier = report_ + "\nloom: recovery: no good step after it: another failure came first (" + f.what() + ")\n";
    report_.clear();
    s_.replacement_began.reset();
  }
  // A survivor that dies during the recovery (its state broadcast) makes the next one.
  fit_position at;
  for (;;) {
    try {
      at = e_.survive(s_, f, opts_, ++recoveries, writer_.get(), report_);
      break;
    } catch (const no_replica_left&) {
      throw;  // a hybrid with no whole replica left: the job ends
    } catch (const rank_failure& again) {
      earlier += "loom: recovery " + std::to_string(recoveries) + " at step " + std::to_string(s_.step) + ": lost " +
                 (s_.interrupted_lost.empty() ? std::string("no rank") : s_.interrupted_lost) +
                 "; interrupted during its state exchange: " + again.what() + "\n";
      f = again;
      s_.failed_at = fault_state.here;
    }
  }
  if (!earlier.empty()) report_ = earlier + report_;
  return at;
}

LOOM_DECL void failure_watch::end(int recoveries) {
  if (!s_.watching || e_.rank() != 0 || recoveries == 0 || !e_.caps.recovers) return;
  std::error_code ec;  // the verdicts of this job are history now
  std::filesystem::remove_all(verdict_directory(opts_.fault, opts_.checkpoint.directory) / ("job-" + e_.watch_job_id()), ec);
}

LOOM_DECL void warn_replace_without_recovery(const fault_options& fo, bool watching) {
  std::fprintf(stderr, "loom: fault_options::replace is on, but no recovery runs in this fit (%s): a lost rank ends "
               "the job and no replacement is started\n",
               !watching ? "failure detection is off" : fo.recovery == recovery_mode::off ? "recovery is off"
                                                                    : "not under mpirun --enable-recovery");
  std::fflush(stderr);
}

LOOM_DECL std::string fmt_seconds(double s) {
  char t[32];
  std::snprintf(t, sizeof t, "%.3f s", s);
  return t;
}

LOOM_DECL std::string recovery_who(const recovery_roll_entry& e) {
  return "rank " + std::to_string(e.rank) + " (" +
         (e.world_rank < 0 ? std::string("a replacement") : "world rank " + std::to_string(e.world_rank)) + ", pid " +
         std::to_string(e.pid) + " on " + e.host + ")";
}

LOOM_DECL std::string recovery_lost(const recovery_result& res) {
  std::string lost;
  for (const int l : res.lost) lost += (lost.empty() ? "" : ", ") + recovery_who(res.roll_call[static_cast<std::size_t>(l)]);
  return lost;
}

LOOM_DECL std::string recovery_roll(const recovery_result& res, double window) {
  std::string roll;
  for (const auto& e : res.roll_call) {
    roll += "\n  " + recovery_who(e) + ": ";
    if (e.answered)
      roll += "finished " + std::to_string(e.committed_step) + " steps; last completed " + e.last_op + " at " +
              to_string(e.last_done) + "; now at " + to_string(e.now);
    else
      roll += "did not answer within " + fmt_seconds(window) + ": the rank the others wait for";
  }
  return roll;
}

LOOM_DECL std::string recovery_report(int number, std::size_t step, const recovery_result& res, const rank_failure& f,
                                      const fault_marker& failed_at, int root, std::size_t behind, double exchange_s,
                                      const std::string& roll) {
  const std::string lost = recovery_lost(res);
  const char* how = f.why() == rank_failure::kind::deadline         ? "timed out"
                    : f.why() == rank_failure::kind::peer_recovery ? "was interrupted by a peer's recovery"
                    : f.why() == rank_failure::kind::peer_gone     ? "found a peer's process gone"
                                                                   : "failed";
  char text[512];
  std::snprintf(text, sizeof text,
                "loom: recovery %d at step %zu: %s; %d ranks go on (were %d); %s %s after %.3f s waiting (%s); "
                "agreement %.3f s, rebuild %.3f s, state from rank %d (%zu steps; this rank had %zu) %.3f s",
                number, step, lost.empty() ? "no rank lost (all answered: a deadline expired on a slow peer)" : ("lost " + lost).c_str(),
                res.new_size, res.old_size, f.operation().c_str(), how, f.waited_s(), to_string(failed_at).c_str(), res.agree_s,
                res.rebuild_s, root, step, behind, exchange_s);
  std::string released;
  for (const int l : res.released)
    released += (released.empty() ? "" : ", ") + recovery_who(res.roll_call[static_cast<std::size_t>(l)]);
  return text + (res.fenced.empty() ? std::string() : "; fenced (killed) the left-out process on this host") +
         (released.empty() ? std::string() : "; left with their replica, which lost a rank: " + released) +
         ". Roll call:" + roll;
}

LOOM_DECL std::string failure_end_report(std::size_t step, const recovery_result& res, const rank_failure& f,
                                         const fault_marker& failed_at, const std::string& why, const std::string& roll) {
  const std::string lost = recovery_lost(res);
  const char* how = f.why() == rank_failure::kind::deadline         ? "timed out"
                    : f.why() == rank_failure::kind::peer_recovery ? "was interrupted by a peer's roll call"
                    : f.why() == rank_failure::kind::peer_gone     ? "found a peer's process gone"
                                                                   : "failed";
  char text[512];
  std::snprintf(text, sizeof text, "loom: failure at step %zu: %s; the job ends: %s. Here %s %s after %.3f s waiting (%s); "
                "agreement %.3f s. Roll call:",
                step, lost.empty() ? "no rank lost (all answered: a deadline expired on a slow peer)" : ("lost " + lost).c_str(),
                why.c_str(), f.operation().c_str(), how, f.waited_s(), to_string(failed_at).c_str(), res.agree_s);
  return text + roll +
         "\nloom: resume from the newest checkpoint (loomrun restarts the job by itself, on the ranks and hosts left)";
}

LOOM_DECL void report_first_good_step(int rank, int world, std::size_t step, const std::string& report,
                                      monitor::clock::time_point failure_seen, monitor::clock::time_point step_end,
                                      const std::optional<monitor::clock::time_point>& replacement_began) {
  if (rank != 0) return;
  std::fprintf(stderr, "%s\nloom: recovery: first good step (%zu) done %.3f s after the wait that failed began "
               "(unix time %.3f)\n", report.c_str(), step, monitor::seconds_between(failure_seen, step_end),
               std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  if (replacement_began)
    std::fprintf(stderr, "loom: replacement: first good step (%zu) on %d ranks done %.3f s after the spawn began\n", step,
                 world, monitor::seconds_between(*replacement_began, step_end));
  std::fflush(stderr);
}

LOOM_DECL void emergency_checkpoint(const std::string& directory, int rank, std::size_t step, io::checkpointer* ckpt,
                                    const std::function<void(io::checkpointer&, collectives&)>& write) noexcept {
  try {
    if (ckpt) ckpt->abandon();
    const std::filesystem::path dir = directory;
    const std::string name = "step-" + std::to_string(step);
    std::error_code ec;
    if (std::filesystem::exists(dir / name / "checkpoint.json", ec)) return;  // committed already
    const std::filesystem::path claim = dir / (".emergency-" + name);
    std::filesystem::create_directories(dir, ec);
    if (::mkdir(claim.c_str(), 0755) != 0) return;  // another survivor writes it
    solo_collectives solo;
    io::checkpointer writer;
    write(writer, solo);
    std::filesystem::remove(claim, ec);
    std::fprintf(stderr, "loom: rank %d: emergency checkpoint of step %zu committed: %s\n", rank, step, (dir / name).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: rank %d: the emergency checkpoint of step %zu failed: %s\n", rank, step, e.what());
  }
  std::fflush(stderr);
}

}  // namespace loom::detail
