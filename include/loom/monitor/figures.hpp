// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-rank figures of a training run (compute, communication, waiting, bytes, throughput, and a
// pipeline stage's bubble and memory), the one list of their names, gathering every rank's
// figures, naming a straggler, the one-sentence diagnosis, and the tables rank 0 prints. The
// one way every engine times a phase, monitor::timed, is in monitor/timeline.hpp; the live view
// is monitor/live.hpp. Knows nothing of communicators beyond an allgather of doubles.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.hpp"

namespace loom {

/// What one rank measured during fit().
struct rank_figures {
  double compute_s = 0;       ///< forward, backward and optimizer
  double comm_s = 0;          ///< from the first bucket's start to the last bucket's completion, summed over steps
  double comm_exposed_s = 0;  ///< time blocked waiting for gradients after backward: communication not hidden
  double wait_s = 0;          ///< blocked in other collectives (loss and accuracy sums, synchronized batch norm's sums)
  double data_s = 0;          ///< reading and converting this rank's samples
  double bytes_sent = 0;      ///< gradient bytes sent, counted as a ring allreduce sends them: 2 (n-1)/n per byte
  double samples = 0;         ///< samples this rank trained on
  double seconds = 0;         ///< wall time of fit()
  // Pipeline stages (zero otherwise):
  double bubble_s = 0;               ///< blocked waiting on activation and gradient sends and receives
  double peak_activation_bytes = 0;  ///< most bytes of saved activations held at once (all live micro-batches)
  double parameter_bytes = 0;        ///< bytes of the parameters this rank holds (its stage's or slice's)
  double stage = 0;                  ///< the pipeline stage this rank runs
  double replica = 0;                ///< the model replica it belongs to (hybrid: rank / stages)
  // This rank's own work per optimizer step, collectives excluded (what a straggler is scored
  // on; monitor::step_recorder): medians over the last live window while fit runs, over the
  // whole fit (its last monitor::step_recorder::capacity steps) when it ends.
  double step_s = 0;          ///< median of compute + data per step
  double step_compute_s = 0;  ///< median compute per step
  double step_data_s = 0;     ///< median data per step
  double resident_bytes = 0;  ///< resident memory (RSS) at the last live exchange, or when fit ended
  // What the collectives carried and what compute did:
  double comm_bytes = 0;   ///< payload bytes of the gradient collectives (their algorithm bytes)
  double bus_bytes = 0;    ///< bytes this rank's collectives moved over its links (allreduce: 2 (n-1)/n x comm_bytes, as a ring sends them)
  double flops = 0;        ///< floating-point operations of this rank's passes: 3 x its layers' forward FLOPs (known at compile time) per sample
  double peak_gflops = 0;  ///< this rank's measured ceiling, GFLOP/s (monitor::measure_peak_gflops; 0: not measured)
  // Memory of loom's host buffers (loom::host_memory):
  double memory_peak_bytes = 0;  ///< the most this process's loom buffers held at once, when fit ended (since the process started or the last loom::reset_host_memory_peak())
  double planned_bytes = 0;      ///< what loom::memory_plan says this rank needs at its share of a full batch (0: no plan, on a backend other than loom::cpu)

  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
  /// Algorithm and bus bandwidth of the gradient collectives while they were in flight, GB/s
  /// (bus = algorithm x 2 (n-1)/n for an allreduce: what each rank's links carried).
  double algorithm_gbps() const { return comm_s > 0 ? comm_bytes / comm_s / 1e9 : 0; }
  double bus_gbps() const { return comm_s > 0 ? bus_bytes / comm_s / 1e9 : 0; }
  /// Share of the gradient communication hidden behind compute, percent (0 without any).
  double overlap_percent() const { return comm_s > 0 ? 100.0 * std::max(0.0, comm_s - comm_exposed_s) / comm_s : 0; }
  /// GFLOP/s achieved while computing, and as a share of the measured ceiling (0 unknown).
  double achieved_gflops() const { return compute_s > 0 ? flops / compute_s / 1e9 : 0; }
  double peak_percent() const { return peak_gflops > 0 ? 100.0 * achieved_gflops() / peak_gflops : 0; }
};

namespace monitor {

/// One field of rank_figures: its name (as the tables and writers print it) and where it is.
struct figure_field {
  std::string_view name;
  double rank_figures::* member;
};

/// Every field of rank_figures, in declaration order: the one list that gathering, sums and
/// the writers go through, so a field added above and here is carried everywhere.
inline constexpr std::array<figure_field, 23> figure_fields{{
    {"compute_s", &rank_figures::compute_s},
    {"comm_s", &rank_figures::comm_s},
    {"comm_exposed_s", &rank_figures::comm_exposed_s},
    {"wait_s", &rank_figures::wait_s},
    {"data_s", &rank_figures::data_s},
    {"bytes_sent", &rank_figures::bytes_sent},
    {"samples", &rank_figures::samples},
    {"seconds", &rank_figures::seconds},
    {"bubble_s", &rank_figures::bubble_s},
    {"peak_activation_bytes", &rank_figures::peak_activation_bytes},
    {"parameter_bytes", &rank_figures::parameter_bytes},
    {"stage", &rank_figures::stage},
    {"replica", &rank_figures::replica},
    {"step_s", &rank_figures::step_s},
    {"step_compute_s", &rank_figures::step_compute_s},
    {"step_data_s", &rank_figures::step_data_s},
    {"resident_bytes", &rank_figures::resident_bytes},
    {"comm_bytes", &rank_figures::comm_bytes},
    {"bus_bytes", &rank_figures::bus_bytes},
    {"flops", &rank_figures::flops},
    {"peak_gflops", &rank_figures::peak_gflops},
    {"memory_peak_bytes", &rank_figures::memory_peak_bytes},
    {"planned_bytes", &rank_figures::planned_bytes},
}};
static_assert(sizeof(rank_figures) == figure_fields.size() * sizeof(double),
              "loom::monitor::figure_fields must name every field of loom::rank_figures");

/// The clock of every span loom measures.
using clock = std::chrono::steady_clock;

/// Seconds from a to b.
inline double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace monitor

/// Field-wise sum a + b (e.g. to add up the figures of several runs).
inline rank_figures operator+(rank_figures a, const rank_figures& b) {
  for (const auto& f : monitor::figure_fields) a.*f.member += b.*f.member;
  return a;
}

/// Every rank's figures on every rank, rank order of comm: `mine` is this rank's. Collective
/// over comm (one allgather of rank_figures' fields as doubles). Comm: a loom communicator.
template <class Comm>
std::vector<rank_figures> gather_figures(Comm& comm, const rank_figures& mine) {
  constexpr std::size_t k = monitor::figure_fields.size();
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  std::array<double, k> v{};
  for (std::size_t i = 0; i < k; ++i) v[i] = mine.*monitor::figure_fields[i].member;
  std::vector<double> all(k * ranks);
  comm.allgather(v.data(), all.data(), k);
  std::vector<rank_figures> out(ranks);
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < k; ++i) out[r].*monitor::figure_fields[i].member = all[r * k + i];
  return out;
}

/// A rank whose own work per step is slow beside its peers': NVIDIA's resiliency extension's
/// rule, scored on the medians of compute + data per step (rank_figures::step_s) and so
/// excluding collectives — inside those the fast ranks are the ones waiting. Peers are the
/// ranks of the same pipeline stage (every rank, without a pipeline).
struct straggler {
  enum class cause { compute, data };
  int rank = -1;     ///< the straggler (-1: none)
  int fastest = -1;  ///< its fastest peer
  double score = 1;  ///< the fastest peer's median ÷ this rank's median; below straggler_threshold
  cause why = cause::compute;  ///< which of its compute and its data per step exceeds the fastest peer's more
  int others = 0;              ///< further ranks below the threshold (the lowest score is named)
  explicit operator bool() const { return rank >= 0; }
};

/// A rank whose score is below this is a straggler.
inline constexpr double straggler_threshold = 0.75;

/// Each rank's score: the fastest median of its peers (same stage) ÷ its own median, in (0, 1];
/// 1 for a rank that measured no step (step_s == 0).
LOOM_DECL std::vector<double> straggler_scores(const std::vector<rank_figures>& ranks);

/// The straggler among `ranks` (the lowest score below straggler_threshold), or none.
LOOM_DECL straggler find_straggler(const std::vector<rank_figures>& ranks);

namespace monitor {
/// Share of f's wall time (seconds) spent in `part` seconds, in percent (0 without time).
inline double percent_of(const rank_figures& f, double part) { return f.seconds > 0 ? 100.0 * part / f.seconds : 0.0; }
/// Share of f's wall time blocked on peers: exposed gradient communication, other collectives, the bubble.
inline double blocked_percent(const rank_figures& f) { return percent_of(f, f.comm_exposed_s + f.wait_s + f.bubble_s); }
}  // namespace monitor

/// One line naming s among `ranks` and saying why, e.g. "straggler: rank 1 (score 0.48 against
/// rank 0): its compute, 6.41 ms a step against 3.08 ms; rank 0 is blocked on its peers 41% of
/// its time". Empty when s names no rank.
LOOM_DECL std::string describe(const straggler& s, const std::vector<rank_figures>& ranks);

/// One sentence on what held the run back most, from every rank's figures: a straggler, then
/// the largest of exposed communication, the pipeline bubble, data loading and other
/// collectives when it takes at least 20% of the step (the mean over ranks), else compute.
LOOM_DECL std::string diagnosis(const std::vector<rank_figures>& ranks);

/// The lines the end-of-run tables close with: the straggler when there is one, and the
/// diagnosis.
LOOM_DECL std::string figures_summary(const std::vector<rank_figures>& ranks);

/// The table of all ranks' figures, one row per rank, as rank 0 prints it, closed by
/// figures_summary (the straggler and the diagnosis).
LOOM_DECL std::string figures_table(const std::vector<rank_figures>& ranks);

/// The table of a pipeline's ranks, one row per rank with its stage and replica: compute time,
/// the bubble (blocked on the pipeline's sends and receives), exposed gradient communication
/// (hybrid), peak activation memory and parameter memory, as rank 0 prints it, closed by
/// figures_summary.
LOOM_DECL std::string stage_figures_table(const std::vector<rank_figures>& ranks);

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/figures.ipp"
#endif
