// SPDX-License-Identifier: Apache-2.0
#pragma once
// The monitoring of a fit as one step observer (loom/core/step_observer.hpp): its set-up and
// every writer — the progress display, the live view and its straggler finder, the metrics
// files, the machine sampler and the timeline — fed after each optimizer step, and at the end
// the figures of every rank, the last metrics and the trace files. What it reads of the ranks
// comes through monitor::rank_source, which the trainer's engine implements.

#include <cstddef>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/step_observer.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/live.hpp"
#include "loom/monitor/metrics.hpp"
#include "loom/monitor/progress.hpp"
#include "loom/monitor/sampler.hpp"
#include "loom/monitor/timeline.hpp"

namespace loom::monitor {

/// What the monitoring reads of this rank and its peers (the trainer's engine gives it).
class rank_source {
 public:
  virtual int rank() const = 0;
  virtual int world() const = 0;
  /// This rank's figures, cleared for a new fit by reset_figures().
  virtual rank_figures& figures() = 0;
  virtual void reset_figures() = 0;
  /// Every rank's figures on every rank, rank order (collective).
  virtual std::vector<rank_figures> gather_figures() = 0;
  /// Every rank's spans on rank 0 (collective).
  virtual std::vector<std::vector<span_event>> gather_timelines(const timeline& t, std::vector<std::size_t>& dropped) = 0;
  /// Forward FLOPs per sample of what this rank runs.
  virtual double flops_per_sample() const = 0;
  /// This machine's measured ceiling, GFLOP/s (measure_peak_gflops, once per process).
  virtual double peak_gflops() = 0;
  /// NVML's view of this rank's device, or null (the CPU, or no NVML).
  virtual std::shared_ptr<const nvml> device_monitor() = 0;

 protected:
  ~rank_source() = default;
};

/// How a fit is watched (loom::fit_options' monitoring fields, and the extent of the fit that
/// progress shows).
struct fit_monitor_options {
  std::ostream* progress = nullptr;
  progress_mode progress_style = progress_mode::automatic;
  metrics_options metrics{};
  double live_every_s = 0;
  std::string trace;
  double sample_every_s = 1.0;
  std::size_t epochs = 1, accumulation = 1, max_steps = 0;
};

/// The monitoring of one fit (see the file comment). Constructed where every rank has just left
/// a collective (the timeline's common zero); lives as long as the fit, retries after a
/// recovery included.
class fit_monitor final : public step_observer {
 public:
  /// Clears the rank's figures and starts every writer the options ask for.
  LOOM_DECL fit_monitor(rank_source& ranks, const fit_monitor_options& o);

  LOOM_DECL void epoch_begins(const epoch_start& e) override;
  void step_begins(std::size_t step) override {
    if (timeline_) timeline_->set_step(static_cast<std::uint32_t>(step));
  }
  LOOM_DECL bool after_step(const step_point& p) override;
  /// The same exchange steps on every rank, replacements included.
  void after_recovery() override { live_.restart(); }

  /// The end of the fit's steps, `seconds` after they began: the last figures (memory, the
  /// plan's bytes), the last metrics, and every rank's figures (collective).
  LOOM_DECL std::vector<rank_figures> finish(double seconds, double planned_bytes);
  /// After the fit: the metrics' end of fit with every rank's figures, and the trace files.
  LOOM_DECL void end(const std::vector<rank_figures>& all);

 private:
  rank_source& ranks_;
  fit_monitor_options o_;
  // The timeline first: the scope below records into it while the fit runs.
  std::optional<timeline> timeline_;
  timeline_scope recording_;
  rank_figures& fig_;
  progress_display progress_;
  metrics_writer metrics_;
  sampler sampler_;
  live_view live_;
  double flops_per_sample_;  // training FLOPs per sample: forward, and backward's two products
  training_point point_;
  std::size_t shown_batches_ = 0, shown_epochs_ = 0;  // what progress shows: where the fit stops
  clock::time_point start_;
};

/// trainer::write_trace's files: this rank's own timeline (under several ranks), and on rank 0
/// every rank's (gathered by the engine).
LOOM_DECL void write_rank_trace(const std::string& path, const timeline& t, int rank, int world);
LOOM_DECL void write_whole_trace(const std::string& path, const std::vector<std::vector<span_event>>& all,
                                 const std::vector<std::size_t>& dropped);

}  // namespace loom::monitor

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/fit_monitor.ipp"
#endif
