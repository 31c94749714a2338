// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of figures.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/monitor/figures.hpp"

namespace loom {

LOOM_DECL std::vector<double> straggler_scores(const std::vector<rank_figures>& ranks) {
  std::vector<double> score(ranks.size(), 1.0);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (!(ranks[r].step_s > 0)) continue;
    double fastest = ranks[r].step_s;
    for (const auto& p : ranks)
      if (p.stage == ranks[r].stage && p.step_s > 0) fastest = std::min(fastest, p.step_s);
    score[r] = fastest / ranks[r].step_s;
  }
  return score;
}

LOOM_DECL straggler find_straggler(const std::vector<rank_figures>& ranks) {
  const std::vector<double> score = straggler_scores(ranks);
  straggler s;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (!(score[r] < straggler_threshold)) continue;
    if (s) ++s.others;
    if (!s || score[r] < s.score) {
      s.rank = static_cast<int>(r);
      s.score = score[r];
    }
  }
  if (!s) return s;
  const rank_figures& me = ranks[static_cast<std::size_t>(s.rank)];
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].stage == me.stage && ranks[r].step_s > 0 &&
        (s.fastest < 0 || ranks[r].step_s < ranks[static_cast<std::size_t>(s.fastest)].step_s))
      s.fastest = static_cast<int>(r);
  const rank_figures& f = ranks[static_cast<std::size_t>(s.fastest)];
  s.why = me.step_data_s - f.step_data_s > me.step_compute_s - f.step_compute_s ? straggler::cause::data
                                                                                 : straggler::cause::compute;
  return s;
}

LOOM_DECL std::string describe(const straggler& s, const std::vector<rank_figures>& ranks) {
  if (!s) return "";
  const rank_figures& me = ranks[static_cast<std::size_t>(s.rank)];
  const rank_figures& f = ranks[static_cast<std::size_t>(s.fastest)];
  const bool data = s.why == straggler::cause::data;
  char line[320];
  std::snprintf(line, sizeof line,
                "straggler: rank %d (score %.2f against rank %d): its %s, %.2f ms a step against %.2f ms; rank %d is "
                "blocked on its peers %.0f%% of its time",
                s.rank, s.score, s.fastest, data ? "data" : "compute",
                1e3 * (data ? me.step_data_s : me.step_compute_s), 1e3 * (data ? f.step_data_s : f.step_compute_s),
                s.fastest, monitor::blocked_percent(f));
  std::string out = line;
  if (s.others) {
    std::snprintf(line, sizeof line, " (%d more rank(s) below %.2f)", s.others, straggler_threshold);
    out += line;
  }
  return out;
}

LOOM_DECL std::string diagnosis(const std::vector<rank_figures>& ranks) {
  if (ranks.empty()) return "";
  char out[400];
  if (const straggler s = find_straggler(ranks)) {
    const rank_figures& me = ranks[static_cast<std::size_t>(s.rank)];
    const rank_figures& f = ranks[static_cast<std::size_t>(s.fastest)];
    const bool data = s.why == straggler::cause::data;
    const double mine = data ? me.step_data_s : me.step_compute_s, theirs = data ? f.step_data_s : f.step_compute_s;
    std::snprintf(out, sizeof out,
                  "rank %d held the others back: its %s took %.1fx rank %d's per step, and rank %d was blocked on its "
                  "peers %.0f%% of its time: %s",
                  s.rank, data ? "data loading" : "compute", theirs > 0 ? mine / theirs : 0.0, s.fastest, s.fastest,
                  monitor::blocked_percent(f),
                  data ? "look at its storage or page cache (memory-map the data set) or its share of the cores"
                       : "look for another load on its cores or a slower machine, and bind ranks to cores");
    return out;
  }
  double exposed = 0, bubble = 0, data = 0, wait = 0, compute = 0;
  for (const auto& f : ranks) {
    exposed += monitor::percent_of(f, f.comm_exposed_s);
    bubble += monitor::percent_of(f, f.bubble_s);
    data += monitor::percent_of(f, f.data_s);
    wait += monitor::percent_of(f, f.wait_s);
    compute += monitor::percent_of(f, f.compute_s);
  }
  const double n = static_cast<double>(ranks.size());
  exposed /= n, bubble /= n, data /= n, wait /= n, compute /= n;
  const double worst = std::max({exposed, bubble, data, wait});
  if (worst >= 20 && worst == exposed)
    std::snprintf(out, sizeof out,
                  "communication was exposed for %.0f%% of the step: raise the batch (more compute per gradient byte), "
                  "or tune the bucket size (loom::bucket_bytes) so more of it overlaps backward, or use faster links",
                  exposed);
  else if (worst >= 20 && worst == bubble)
    std::snprintf(out, sizeof out,
                  "the pipeline bubble took %.0f%% of the step: use more micro-batches, the 1F1B schedule, or "
                  "stages of more even cost",
                  bubble);
  else if (worst >= 20 && worst == data)
    std::snprintf(out, sizeof out,
                  "reading and converting samples took %.0f%% of the step: data loading is the bottleneck (image "
                  "shards: give the decoding threads more cores — fewer compute threads per rank, --threads, leave "
                  "them to --decode-threads — or store the images nearer the network's input size; IDX: memory-map "
                  "the data set; or raise the batch)",
                  data);
  else if (worst >= 20)
    std::snprintf(out, sizeof out,
                  "the ranks waited in other collectives (loss and accuracy sums) for %.0f%% of the step: raise the "
                  "batch",
                  wait);
  else
    std::snprintf(out, sizeof out,
                  "compute took %.0f%% of the step: the run is compute-bound (exposed communication %.0f%%, data %.0f%%, "
                  "waiting %.0f%%)",
                  compute, exposed, data, wait + bubble);
  return out;
}

LOOM_DECL std::string figures_summary(const std::vector<rank_figures>& ranks) {
  if (ranks.empty()) return "";
  std::string out;
  if (const straggler s = find_straggler(ranks)) out += describe(s, ranks) + "\n";
  return out + "diagnosis: " + diagnosis(ranks) + "\n";
}

LOOM_DECL std::string figures_table(const std::vector<rank_figures>& ranks) {
  std::string out = "rank  compute_s  comm_s  exposed_s  wait_s  data_s  mem_MB  plan_MB  sent_MB  samples/s\n";
  char line[256];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& f = ranks[r];
    std::snprintf(line, sizeof line, "%4zu  %9.3f  %6.3f  %9.3f  %6.3f  %6.3f  %6.1f  %7.1f  %7.1f  %9.0f\n", r, f.compute_s,
                  f.comm_s, f.comm_exposed_s, f.wait_s, f.data_s, f.memory_peak_bytes / 1e6, f.planned_bytes / 1e6,
                  f.bytes_sent / 1e6, f.samples_per_s());
    out += line;
  }
  return out + figures_summary(ranks);
}

LOOM_DECL std::string stage_figures_table(const std::vector<rank_figures>& ranks) {
  std::string out =
      "rank  stage  replica  compute_s  bubble_s  bubble%  exposed_s  act_peak_MB  params_MB  mem_MB  plan_MB  sent_MB\n";
  char line[256];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& f = ranks[r];
    const double busy = f.compute_s + f.bubble_s;
    std::snprintf(line, sizeof line, "%4zu  %5.0f  %7.0f  %9.3f  %8.3f  %6.1f%%  %9.3f  %11.3f  %9.3f  %6.1f  %7.1f  %7.1f\n", r,
                  f.stage, f.replica, f.compute_s, f.bubble_s, busy > 0 ? 100.0 * f.bubble_s / busy : 0.0, f.comm_exposed_s,
                  f.peak_activation_bytes / 1e6, f.parameter_bytes / 1e6, f.memory_peak_bytes / 1e6, f.planned_bytes / 1e6,
                  f.bytes_sent / 1e6);
    out += line;
  }
  return out + figures_summary(ranks);
}
}  // namespace loom
