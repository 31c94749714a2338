// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-rank figures of a training run (compute, communication, waiting, bytes, throughput) and
// the table rank 0 prints of all ranks.

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
  static constexpr std::size_t field_count = 8;

  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
  std::vector<double> to_vector() const {
    return {compute_s, comm_s, comm_exposed_s, wait_s, data_s, bytes_sent, samples, seconds};
  }
  static rank_figures from(const double* v) { return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}; }
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

}  // namespace loom
