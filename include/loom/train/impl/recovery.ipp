// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of recovery.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/train/recovery.hpp"

namespace loom::detail {

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
