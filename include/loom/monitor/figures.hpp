// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-rank figures of a training run (compute, communication, waiting, bytes, throughput, and a
// pipeline stage's bubble and memory), the one list of their names, gathering every rank's
// figures, and the tables rank 0 prints. The one way every engine times a phase,
// monitor::timed, is in monitor/timeline.hpp. Knows nothing of communicators beyond an
// allgather of doubles.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

/// What one rank measured during fit().
struct rank_figures {
  double compute_s = 0;       ///< forward, backward and optimizer
  double comm_s = 0;          ///< from the first bucket's start to the last bucket's completion, summed over steps
  double comm_exposed_s = 0;  ///< time blocked waiting for gradients after backward: communication not hidden
  double wait_s = 0;          ///< blocked in other collectives (loss and accuracy sums)
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

  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
};

namespace monitor {

/// One field of rank_figures: its name (as the tables and writers print it) and where it is.
struct figure_field {
  std::string_view name;
  double rank_figures::* member;
};

/// Every field of rank_figures, in declaration order: the one list that gathering, sums and
/// the writers go through, so a field added above and here is carried everywhere.
inline constexpr std::array<figure_field, 13> figure_fields{{
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

/// The table of all ranks' figures, one row per rank, as rank 0 prints it.
inline std::string figures_table(const std::vector<rank_figures>& ranks) {
  std::string out = "rank  compute_s  comm_s  exposed_s  wait_s  data_s  sent_MB  samples/s\n";
  char line[256];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& f = ranks[r];
    std::snprintf(line, sizeof line, "%4zu  %9.3f  %6.3f  %9.3f  %6.3f  %6.3f  %7.1f  %9.0f\n", r, f.compute_s, f.comm_s,
                  f.comm_exposed_s, f.wait_s, f.data_s, f.bytes_sent / 1e6, f.samples_per_s());
    out += line;
  }
  return out;
}

/// The table of a pipeline's ranks, one row per rank with its stage and replica: compute time,
/// the bubble (blocked on the pipeline's sends and receives), exposed gradient communication
/// (hybrid), peak activation memory and parameter memory, as rank 0 prints it.
inline std::string stage_figures_table(const std::vector<rank_figures>& ranks) {
  std::string out = "rank  stage  replica  compute_s  bubble_s  bubble%  exposed_s  act_peak_MB  params_MB  sent_MB\n";
  char line[256];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& f = ranks[r];
    const double busy = f.compute_s + f.bubble_s;
    std::snprintf(line, sizeof line, "%4zu  %5.0f  %7.0f  %9.3f  %8.3f  %6.1f%%  %9.3f  %11.3f  %9.3f  %7.1f\n", r, f.stage,
                  f.replica, f.compute_s, f.bubble_s, busy > 0 ? 100.0 * f.bubble_s / busy : 0.0, f.comm_exposed_s,
                  f.peak_activation_bytes / 1e6, f.parameter_bytes / 1e6, f.bytes_sent / 1e6);
    out += line;
  }
  return out;
}

}  // namespace loom
