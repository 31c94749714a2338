// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-rank figures of a training run (compute, communication, waiting, bytes, throughput, and a
// pipeline stage's bubble and memory) and the tables rank 0 prints of all ranks.

#include <cstddef>
#include <cstdio>
#include <string>
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
  double parameter_bytes = 0;        ///< bytes of the parameters this rank holds (its stage's)
  double stage = 0;                  ///< the pipeline stage this rank runs
  double replica = 0;                ///< the model replica it belongs to (hybrid: rank / stages)
  static constexpr std::size_t field_count = 13;

  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
  std::vector<double> to_vector() const {
    return {compute_s, comm_s,   comm_exposed_s, wait_s,          data_s, bytes_sent, samples,
            seconds,   bubble_s, peak_activation_bytes, parameter_bytes, stage,  replica};
  }
  static rank_figures from(const double* v) {
    return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12]};
  }
};

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
