// SPDX-License-Identifier: Apache-2.0
#pragma once
// Live metrics of one rank while it trains, in the formats tools read: a Prometheus text
// exposition file (a node_exporter textfile, rewritten atomically), JSON lines for scripts and
// TensorBoard event files (their encoding is in tensorboard.hpp). Each rank writes its own files
// every few seconds from its own figures and the sampler's latest sample (monitor/sampler.hpp:
// memory, CPU, network, device) — no communication, so a slow or stuck rank still reports,
// and nothing waits for it. Not here: the live view across ranks and timelines.

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/sampler.hpp"
#include "loom/monitor/tensorboard.hpp"
#include "loom/monitor/timeline.hpp"

namespace loom {

/// Where and how often a rank writes its metrics during fit (empty paths: not written).
/// Under several ranks, each rank writes its own file: `.rank<r>` goes before the extension
/// (metrics.prom → metrics.rank1.prom), so one node_exporter textfile directory holds them all.
struct metrics_options {
  /// Prometheus text exposition (node_exporter's textfile collector reads `*.prom`).
  std::string prometheus_file;
  /// One JSON object per line, appended at each write.
  std::string jsonl_file;
  /// Seconds between writes (0: after every optimizer step); the last state is always written
  /// when fit ends.
  double every_s = 5;
  /// TensorBoard event files: each rank's under `DIR/rank<r>/` (one TensorBoard run per rank),
  /// with the scalars of every write, and at the end of fit the figures of every rank as a
  /// Markdown table and the hparams (empty: none).
  std::string tensorboard_dir;
  /// Only rank 0 writes TensorBoard events (`DIR/rank0/`).
  bool tensorboard_rank0_only = false;
  /// The run's hyperparameters, for TensorBoard's hparams dashboard and a text summary (the
  /// writer adds `ranks` when it is not among them).
  std::vector<hparam> hparams;
};

namespace monitor {

/// The training state a metrics write reports besides the figures.
struct training_point {
  std::size_t step = 0;        ///< optimizer steps so far (over all fit calls)
  std::size_t epoch = 0;       ///< 1-based epoch in progress
  double loss = 0;             ///< mean loss of this rank's replica over the epoch so far
  double accuracy = 0;         ///< likewise
  double lr = 0;               ///< learning rate of the last step
  double samples_per_s = 0;    ///< global samples per second since fit started
  double elapsed_s = 0;        ///< seconds since fit started
};

/// `path` with `.rank<r>` before its extension when several ranks write (see metrics_options).
LOOM_DECL std::string rank_path(const std::string& path, int rank, int world);

/// Every rank's figures as a Markdown table (a row per rank, a column per figure, then
/// samples/s), as the end-of-run TensorBoard text shows them.
LOOM_DECL std::string figures_markdown(const std::vector<rank_figures>& ranks);

/// The hyperparameters as a two-column Markdown table.
LOOM_DECL std::string hparams_markdown(const std::vector<hparam>& hparams);

/// Writes one rank's metrics files (see metrics_options). Throws loom::io_error naming the
/// file (or TensorBoard's directory) when one cannot be written; a failed Prometheus write
/// leaves the previous file whole.
class metrics_writer {
 public:
  // Out of line (here and in tick): every fit of every trainer type constructs one. The
  // definitions (impl/metrics.ipp) carry [[gnu::noinline]]: on the declarations here, gcc
  // warns at the inline definition that follows.
  metrics_writer(const metrics_options& o, int rank, int world);

  bool enabled() const noexcept { return !prom_.empty() || !jsonl_.empty() || tb_; }
  const std::string& prometheus_path() const noexcept { return prom_; }
  const std::string& jsonl_path() const noexcept { return jsonl_; }
  /// This rank's TensorBoard event file (empty: none).
  std::string tensorboard_path() const { return tb_ ? tb_->path() : std::string(); }

  /// Writes when every_s has passed since the last write (or force); one clock read otherwise.
  /// `m`: the sampler's latest sample (memory, CPU, network, device).
  void tick(const rank_figures& f, const training_point& p, const machine_sample& m, bool force = false) {
    if (enabled()) write_if_due(f, p, m, force);
  }

  /// The live view's verdict at an exchange after optimizer step `step` (every rank has the
  /// same): rank 0 writes it to TensorBoard at once as `live/straggler_rank` (-1: none) and
  /// `live/straggler_score`.
  void straggler_seen(std::size_t step, const straggler& s);

  /// At the end of fit, after the last tick: the TensorBoard text summaries (`run/figures`:
  /// every rank's figures as a Markdown table; `run/hparams`) and the hparams session's end.
  /// `ranks`: every rank's figures (loom::gather_figures); no collective here.
  void end_of_fit(const std::vector<rank_figures>& ranks);

 private:
  void write_if_due(const rank_figures& f, const training_point& p, const machine_sample& s, bool force);

  static std::string num(double v);

  void write_prometheus(const rank_figures& f, const training_point& p, const machine_sample& m);

  void write_jsonl(const rank_figures& f, const training_point& p, const machine_sample& m);

  // One event of scalars per write, flushed. train/step_time_s is the mean over the steps since
  // the previous write (the first write follows the fit's first step; a write without a new
  // step repeats the last value); percent/* are shares of the fit's wall time so far.
  void write_tensorboard(const rank_figures& f, const training_point& p, const machine_sample& m);

  double every_s_;
  int rank_;
  std::string prom_, jsonl_;
  std::ofstream jsonl_out_;
  std::vector<hparam> hparams_;
  std::optional<event_file> tb_;
  summary tb_summary_;
  std::string tb_tag_;
  std::size_t tb_step_ = 0;
  double tb_elapsed_s_ = 0, tb_step_time_s_ = 0;
  bool tb_written_ = false;
  clock::time_point last_{};
  bool written_ = false;
};

}  // namespace monitor
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/metrics.ipp"
#endif
