// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fault tolerance's vocabulary, free of MPI: the options of fit (fault_options), the failure a
// communicator raises when a collective cannot finish (rank_failure), where this rank is in its
// step (fault_marker), which every rank reports when the survivors of a failure take their roll
// call, and this process's fault state, all in one place (detail::fault_state). What loom reads
// of Open MPI's runtime and tells a launcher is loom/comm/open_mpi.hpp; the detection and the
// recovery protocol are loom/comm/mpi.hpp and loom/comm/mpi_recovery.hpp; the trainer drives
// them (docs/fault-tolerance.md).

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/core/error.hpp"

namespace loom {

/// Whether fit continues on the survivors when a rank fails (fault_options::recovery).
enum class recovery_mode {
  /// On when the job runs under `mpirun --enable-recovery` (or loomrun, which passes it): then
  /// the runtime keeps the survivors alive; off otherwise.
  automatic,
  /// Always on (a runtime that kills the survivors makes it moot).
  on,
  /// Never: a failed or hung rank ends the job cleanly (after an emergency checkpoint).
  off,
};

/// How fit detects and survives a failed or hung rank (fit_options::fault). The deadlines
/// apply to every collective of a fit on several ranks over loom::mpi_comm (a pipeline's,
/// tensor-parallel or hybrid policy's communicators too, where a failure ends the job after a
/// roll call instead of a recovery).
struct fault_options {
  /// Deadlines on every collective (false: none; a dead peer then blocks the others until the
  /// runtime ends the job).
  bool detect = true;
  recovery_mode recovery = recovery_mode::automatic;
  /// A collective that has not finished after this many seconds means a peer is dead or hung
  /// (0: derived from the step times measured: deadline_steps times the median of the last
  /// 16 steps, at least min_deadline_s).
  double deadline_s = 0;
  double deadline_steps = 20;
  double min_deadline_s = 0.5;
  /// The least deadline where no recovery follows (plain mpirun, recovery off): a deadline
  /// that expires there ends the job, so it is long; a dead peer on this host, or mpirun's
  /// SIGTERM after a death, is seen at once anyway.
  double min_deadline_without_recovery_s = 30;
  /// The deadline before enough steps are measured (start, the first steps after a recovery,
  /// whose new batch shapes compile new kernels), and the least one of a checkpoint's
  /// collectives until a checkpoint's time is measured (the peers of the rank that writes the
  /// most wait for it).
  double startup_deadline_s = 60;
  /// The deadline of a checkpoint's collectives once a checkpoint's time is measured:
  /// deadline_steps times the longest checkpoint seen (the longest any rank took to write its
  /// part, rank 0 to commit), at least this (a write's time on shared storage varies far more
  /// than a step's) and at least the step deadline.
  double min_checkpoint_deadline_s = 10;
  /// When no recovery is possible (plain mpirun, which kills the survivors a second after a
  /// rank dies; SIGTERM), a survivor that holds a whole replica writes an emergency checkpoint
  /// of the last step every rank finished, so that no step is lost (needs a checkpoint
  /// directory and checkpoint_options::on_signal).
  bool emergency_checkpoint = true;
  /// Where the survivors of a failure record their verdict (who goes on) with an exclusive
  /// create, so that the world can never split into two groups that both go on. Every rank
  /// must see the same directory. Empty: `.loom-recovery` in the checkpoint directory, else
  /// $LOOM_RECOVERY_DIR, else /tmp/loom-recovery (one host only).
  std::string verdict_dir;
  /// After a recovery that lost ranks, start as many new processes (MPI_Comm_spawn: the same
  /// program and arguments, on the lost ranks' hosts where the runtime lets) and merge them
  /// into the world, so that training goes on with N ranks again: the survivors keep their
  /// ranks, the newcomers take the highest ones and receive the survivors' state. When they
  /// cannot be started (no slots, the runtime refuses, replace_timeout_s passes) the survivors
  /// go on with N-1 and say why. data_parallel over loom::mpi_comm without
  /// shard_optimizer_state only; fit refuses it elsewhere (docs/fault-tolerance.md).
  bool replace = false;
  /// How long the survivors wait for the newcomers to join (their start, the job check, the
  /// state exchange); a spawn or merge the runtime never finishes ends the process after it
  /// (status 75, as a stuck rebuild).
  double replace_timeout_s = 30;
};

/// What a rank was doing, in the order of a step.
enum class fault_phase : std::uint8_t {
  start, data, forward_backward, gradient_allreduce, loss_sums, optimizer, checkpoint, bookkeeping, evaluation,
  end_of_fit, recovery, step_commit
};
constexpr const char* to_string(fault_phase p) noexcept {
  switch (p) {
    case fault_phase::start: return "start";
    case fault_phase::data: return "data";
    case fault_phase::forward_backward: return "forward/backward";
    case fault_phase::gradient_allreduce: return "gradient allreduce";
    case fault_phase::loss_sums: return "loss sums";
    case fault_phase::optimizer: return "optimizer step";
    case fault_phase::checkpoint: return "checkpoint";
    case fault_phase::bookkeeping: return "step bookkeeping";
    case fault_phase::evaluation: return "evaluation";
    case fault_phase::end_of_fit: return "end of fit";
    case fault_phase::recovery: return "recovery";
    case fault_phase::step_commit: return "step commit";
  }
  return "?";
}

/// Where this rank is: the optimizer step (the one being computed), its phase, and the
/// gradient bucket (-1: none). Plain stores by the trainer and the gradient allreduce; read by
/// the communicator's deadline check for the roll call.
struct fault_marker {
  std::uint64_t step = 0;
  fault_phase phase = fault_phase::start;
  std::int32_t bucket = -1;
};
inline std::string to_string(const fault_marker& m) {
  return "step " + std::to_string(m.step) + ", " + to_string(m.phase) +
         (m.bucket >= 0 ? " (bucket " + std::to_string(m.bucket) + ")" : "");
}

namespace detail {
/// What this process knows of failures, in one place: plain stores by the trainer, the
/// communicators and the signal handler, read where a wait decides whether to give up and by
/// the roll call. One per process (detail::fault_state).
struct process_fault_state {
  /// Where this rank is: the step being computed, its phase and bucket (the roll call's "now").
  fault_marker here{};
  /// The signal that asked fit to stop (SIGUSR1 or SIGTERM while checkpoint_options::on_signal),
  /// 0 when none did. Set by the handler fit installs for its duration; a communicator waiting in
  /// a collective that does not finish reads it too (SIGTERM from mpirun after a rank died).
  volatile std::sig_atomic_t preemption_signal = 0;
  /// The deadline of the communicators without a failure detector of their own (0: none): set
  /// while the runtime keeps survivors alive (mpirun --enable-recovery), so that a pipeline or a
  /// tensor-parallel group whose peer died ends instead of waiting forever; the trainer keeps it
  /// at its step-derived deadline.
  double shared_deadline_s = 0;
  /// Whether this process went through a recovery (loom::recover_world): MPI_Finalize may then
  /// wait forever for the dead (Open MPI's fence includes them), so the end of the program does
  /// not wait for it (loom::mpi::environment).
  bool recovered = false;
  /// This process was started by the survivors of a failure to replace a lost rank
  /// (fault_options::replace; loom::mpi::environment saw a parent and merged into its world) and
  /// has not joined the training yet: the trainer's start-up collectives, which the survivors do
  /// not run, are skipped, and its first fit receives the survivors' state instead.
  bool joining_as_replacement = false;
  /// When this replacement process started MPI (unix time), for its report.
  double replacement_started_unix = 0;
  /// Set once this process has seen a peer fail (a loom::rank_failure was made: a deadline, a
  /// dead peer, a recovery, the runtime's SIGTERM): a failed end of this process is then told to
  /// the launcher as a consequence of that failure, not as the program's own error
  /// (detail::write_exit_status, loom/comm/open_mpi.hpp).
  std::atomic<bool> peer_failure_seen{false};
};
inline process_fault_state fault_state{};

/// This rank is in phase p of its step (in gradient bucket `bucket`, -1: none).
inline void set_phase(fault_phase p, std::int32_t bucket = -1) noexcept {
  fault_state.here.phase = p;
  fault_state.here.bucket = bucket;
}
}  // namespace detail

/// Where the verdicts of a job go (fault_options::verdict_dir's rule).
inline std::filesystem::path verdict_directory(const fault_options& f, const std::string& checkpoint_dir) {
  if (!f.verdict_dir.empty()) return f.verdict_dir;
  if (!checkpoint_dir.empty()) return std::filesystem::path(checkpoint_dir) / ".loom-recovery";
  if (const char* e = std::getenv("LOOM_RECOVERY_DIR"); e && *e) return e;
  return "/tmp/loom-recovery";
}

/// What a survivor brings to a recovery (loom::recover_world).
struct recovery_request {
  /// The optimizer steps this rank has finished (its state is the one after them).
  std::uint64_t committed_step = 0;
  /// How long to wait for the others' messages: who has not answered by then is left out.
  double window_s = 1;
  /// The shared directory of the verdicts (fault_options::verdict_dir).
  std::filesystem::path verdict_dir;
  /// A rebuild of the communicator that has not finished after this long (a survivor died
  /// during it) ends this process with status 75, so that the launcher restarts the job.
  double rebuild_timeout_s = 30;
  /// false: the roll call and the verdict only — no fencing, no new communicator (a job that
  /// cannot go on without the lost ranks: it reports and ends; loom::fence_left_out).
  bool rebuild = true;
  /// The old communicator is made of consecutive groups of this many ranks that go on only
  /// whole (a hybrid's model replicas: ranks g*group_size .. (g+1)*group_size-1 hold one
  /// replica together). A verdict that loses a rank of a group leaves the group's other ranks
  /// out too (recovery_result::released); 1: every rank stands alone.
  int group_size = 1;
};

/// One rank of the old communicator in the roll call of a recovery.
struct recovery_roll_entry {
  int rank = 0;        // in the old communicator
  int world_rank = 0;  // in MPI_COMM_WORLD
  long pid = 0;
  std::string host;
  bool answered = false;
  std::uint64_t committed_step = 0;
  std::string last_op;  // the last operation that completed there
  fault_marker last_done{}, now{};
};

/// What a recovery decided and how long it took.
struct recovery_result {
  std::uint64_t epoch = 0;  // the new membership epoch
  int old_rank = 0, old_size = 0, new_rank = 0, new_size = 0;
  std::vector<recovery_roll_entry> roll_call;  // every rank of the old communicator
  std::vector<int> lost;                       // old ranks left out
  bool excluded = false;                       // this rank is left out: it must leave
  std::vector<int> released;                   // old ranks the verdict kept but whose group lost a
                                               // rank (recovery_request::group_size): they leave
  bool no_whole_group = false;                 // every group lost a rank: nobody can go on
  int verdict_by = -1;                         // the old rank whose verdict was taken
  std::filesystem::path verdict;
  std::vector<long> fenced;                    // processes this rank killed (same host, left out)
  double agree_s = 0, rebuild_s = 0;
};

/// A collective could not finish: a peer died or hangs (the deadline passed), a peer started a
/// recovery, MPI reported an error (in a wait, or refusing to start an operation: mpi_error), or
/// the job is being ended (SIGTERM) while this rank waited.
/// The communicator it came from is broken: its pending operations are abandoned.
class rank_failure : public communication_error {
 public:
  enum class kind { deadline, peer_gone, peer_recovery, mpi_error, terminating };
  rank_failure(kind k, std::string op, double waited_s, int peer, const std::string& message)
      : communication_error(message), kind_(k), op_(std::move(op)), waited_s_(waited_s), peer_(peer) {
    detail::fault_state.peer_failure_seen.store(true);
  }
  kind why() const noexcept { return kind_; }
  /// The operation that was waiting ("allreduce", "iallreduce", "recv", ...).
  const std::string& operation() const noexcept { return op_; }
  /// How long it waited, in seconds.
  double waited_s() const noexcept { return waited_s_; }
  /// The peer that started the recovery (peer_recovery), else -1.
  int peer() const noexcept { return peer_; }

 private:
  kind kind_;
  std::string op_;
  double waited_s_;
  int peer_;
};

}  // namespace loom
