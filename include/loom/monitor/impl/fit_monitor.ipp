// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of fit_monitor.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <unistd.h>

#include <algorithm>

#include "loom/core/memory.hpp"
#include "loom/monitor/fit_monitor.hpp"

namespace loom::monitor {

namespace detail {
inline bool is_terminal(const std::ostream* out) {
  return out == &std::cerr ? ::isatty(2) : out == &std::cout ? ::isatty(1) : false;
}
/// The timeline of a fit that asks for a trace, its zero now (every rank has just left a
/// collective: the ranks' common zero); null otherwise.
inline timeline* start_timeline(std::optional<timeline>& t, const std::string& trace) {
  if (trace.empty()) return nullptr;
  t.emplace().set_zero(clock::now());
  return &*t;
}
/// A fit's figures, cleared.
inline rank_figures& cleared_figures(rank_source& ranks) {
  ranks.reset_figures();
  return ranks.figures();
}
}  // namespace detail

LOOM_DECL fit_monitor::fit_monitor(rank_source& ranks, const fit_monitor_options& o)
    : ranks_(ranks),
      o_(o),
      recording_(detail::start_timeline(timeline_, o.trace)),
      fig_(detail::cleared_figures(ranks)),
      progress_(ranks.rank() == 0 ? o.progress : nullptr, o.progress_style, detail::is_terminal(o.progress)),
      metrics_(o.metrics, ranks.rank(), ranks.world()),
      sampler_(fig_, ranks.device_monitor(), o.sample_every_s),
      live_(o.live_every_s, fig_, ranks.rank() == 0 ? o.progress : nullptr, o.progress_style),
      flops_per_sample_(3.0 * ranks.flops_per_sample()),
      start_(clock::now()) {
  // The machine's ceiling, against which the achieved GFLOP/s are shown: measured once per
  // process (about 0.1 s) when something shows it.
  if (metrics_.enabled() || o.live_every_s > 0 || timeline_) fig_.peak_gflops = ranks.peak_gflops();
}

LOOM_DECL void fit_monitor::epoch_begins(const epoch_start& e) {
  shown_batches_ = e.batches;
  shown_epochs_ = o_.epochs;
  if (!o_.max_steps) return;
  // With max_steps, progress shows where this epoch and the fit will stop.
  const std::size_t a = o_.accumulation;
  const std::size_t left = o_.max_steps > e.step ? o_.max_steps - e.step : 0;  // steps
  const std::size_t per_epoch = (e.batches + a - 1) / a;
  const std::size_t this_epoch = (e.batches - e.first_batch + a - 1) / a;
  shown_batches_ = std::min(e.batches, e.first_batch + left * a);
  if (left > this_epoch && per_epoch)
    shown_epochs_ = std::min(o_.epochs, e.epoch + 1 + (left - this_epoch + per_epoch - 1) / per_epoch);
  else
    shown_epochs_ = std::min(o_.epochs, e.epoch + 1);
}

LOOM_DECL bool fit_monitor::after_step(const step_point& p) {
  record_span(step_span, p.started, p.ended);
  fig_.samples += static_cast<double>(p.samples);
  fig_.flops += flops_per_sample_ * static_cast<double>(p.samples);
  point_ = {.step = p.step, .epoch = p.epoch + 1, .loss = p.epoch_sums.mean_loss(), .accuracy = p.epoch_sums.accuracy(),
            .lr = p.lr, .elapsed_s = seconds_between(start_, clock::now())};
  point_.samples_per_s = static_cast<double>(p.trained) / std::max(1e-9, point_.elapsed_s);
  progress_.update(p.epoch + 1, shown_epochs_, p.batch, shown_batches_, point_.loss, point_.accuracy, point_.samples_per_s);
  sampler_.tick();
  metrics_.tick(fig_, point_, sampler_.latest());
  const std::size_t exchanges = live_.exchanges();
  live_.step(p.epoch, [&] { return ranks_.gather_figures(); });
  if (live_.exchanges() != exchanges) {  // an exchange: the straggler it found, if any, named
    const straggler& s = live_.last_straggler();
    metrics_.straggler_seen(p.step, s);
    if (s) {
      const auto now = clock::now();
      record_span(span_kind::straggler, now, now, s.rank, s.why == straggler::cause::data ? 1 : 0, s.score);
    }
  }
  return true;
}

LOOM_DECL std::vector<rank_figures> fit_monitor::finish(double seconds, double planned_bytes) {
  fig_.seconds = seconds;
  fig_.memory_peak_bytes = static_cast<double>(host_memory().peak_bytes);
  fig_.planned_bytes = planned_bytes;
  point_.elapsed_s = seconds;
  live_.finish();
  metrics_.tick(fig_, point_, sampler_.sample_now(), /*force=*/true);
  return ranks_.gather_figures();
}

LOOM_DECL void fit_monitor::end(const std::vector<rank_figures>& all) {
  metrics_.end_of_fit(all);
  if (!timeline_) return;
  // This rank's own file under several ranks, and on rank 0 every rank's (collective).
  const int rank = ranks_.rank(), world = ranks_.world();
  if (world > 1) write_rank_trace(o_.trace, *timeline_, rank, world);
  std::vector<std::size_t> dropped;
  const auto every = ranks_.gather_timelines(*timeline_, dropped);
  if (rank == 0) write_whole_trace(o_.trace, every, dropped);
}

LOOM_DECL void write_rank_trace(const std::string& path, const timeline& t, int rank, int world) {
  write_file_atomically(rank_path(path, rank, world), chrome_trace({t.events()}, {t.dropped()}, rank));
}

LOOM_DECL void write_whole_trace(const std::string& path, const std::vector<std::vector<span_event>>& all,
                                 const std::vector<std::size_t>& dropped) {
  write_file_atomically(path, chrome_trace(all, dropped));
}

}  // namespace loom::monitor
