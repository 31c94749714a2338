// SPDX-License-Identifier: Apache-2.0
#pragma once
// The live view: every few seconds rank 0 shows a row per rank (past 16 ranks, the minimum,
// median and maximum of each column and which rank has it) — samples/s, compute, exposed
// communication, waiting and data as shares of the time, the share of gradient communication
// hidden behind compute (overlap), the collectives' bus bandwidth, the GFLOP/s achieved in
// compute, resident memory, the median step and the straggler score — and a line naming the straggler when there is one. Redrawn in place on
// a terminal, printed as lines otherwise. Also the step recorder whose medians the straggler
// score is computed from (loom::find_straggler, monitor/figures.hpp), kept on every fit.
//
// When to exchange: the ranks must agree without a collective per step. They exchange figures
// (one gather_figures: an allgather of rank_figures) at fixed step counts: the first after
// live_view::first_exchange steps, each next one `interval` steps later, where the interval is
// computed on every rank from the same gathered numbers — rank 0's seconds over the last window
// — so rank 0's timing reaches every rank inside the exchange itself, with nothing added.

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/metrics.hpp"
#include "loom/monitor/progress.hpp"
#include "loom/monitor/timeline.hpp"

namespace loom::monitor {

/// This rank's compute and data seconds of each of its last `capacity` optimizer steps, read
/// from its figures after each step (two subtractions and a store), and their medians.
class step_recorder {
 public:
  static constexpr std::size_t capacity = 8192;

  explicit step_recorder(const rank_figures& f) : fig_(&f), compute_(f.compute_s), data_(f.data_s) {}

  /// Takes the step that just ended.
  void record() {
    steps_[recorded_ % capacity] = {fig_->compute_s - compute_, fig_->data_s - data_};
    compute_ = fig_->compute_s;
    data_ = fig_->data_s;
    ++recorded_;
  }
  std::size_t recorded() const { return recorded_; }

  /// Medians of the last k steps (at most those recorded and capacity) into into.step_s,
  /// step_compute_s and step_data_s; zeros when none was recorded.
  void medians(std::size_t k, rank_figures& into) const;

  /// The lower median of v (an element of v; 0 when v is empty). Reorders v.
  static double median(std::vector<double>& v);

 private:
  const rank_figures* fig_;
  double compute_, data_;  // the figures after the last recorded step
  std::vector<std::array<double, 2>> steps_ = std::vector<std::array<double, 2>>(capacity);
  std::size_t recorded_ = 0;
};

/// The minimum, (lower) median and maximum of one column over the ranks, and which rank has
/// each (the lowest rank among equals).
struct column_fold {
  double min = 0, median = 0, max = 0;
  int min_rank = -1, median_rank = -1, max_rank = -1;
};

LOOM_DECL column_fold fold_column(const std::vector<double>& v);

/// The figures of a window: now - before for the figures that add up over a run (times, bytes,
/// samples, seconds); the rest (medians, memory, stage) as they are now.
LOOM_DECL rank_figures window_of(const rank_figures& now, const rank_figures& before);

/// The columns of the live view, one value per rank of a window's figures.
struct live_column {
  const char* name;
  const char* format;  // printf format of one value
  double (*value)(const rank_figures&, double score);
};
inline constexpr std::array<live_column, 11> live_columns{{
    {"samples/s", "%.0f", [](const rank_figures& f, double) { return f.seconds > 0 ? f.samples / f.seconds : 0.0; }},
    {"compute%", "%.1f", [](const rank_figures& f, double) { return percent_of(f, f.compute_s); }},
    {"exposed%", "%.1f", [](const rank_figures& f, double) { return percent_of(f, f.comm_exposed_s); }},
    {"overlap%", "%.1f", [](const rank_figures& f, double) { return f.overlap_percent(); }},
    {"wait%", "%.1f", [](const rank_figures& f, double) { return percent_of(f, f.wait_s + f.bubble_s); }},
    {"data%", "%.1f", [](const rank_figures& f, double) { return percent_of(f, f.data_s); }},
    {"bus_GB/s", "%.2f", [](const rank_figures& f, double) { return f.bus_gbps(); }},
    {"GFLOP/s", "%.1f", [](const rank_figures& f, double) { return f.achieved_gflops(); }},
    {"RSS_MB", "%.1f", [](const rank_figures& f, double) { return f.resident_bytes / 1e6; }},
    {"step_ms", "%.2f", [](const rank_figures& f, double) { return 1e3 * f.step_s; }},
    {"score", "%.2f", [](const rank_figures&, double s) { return s; }},
}};

/// Characters a column's values take: its name's, at least 6.
inline int column_width(const live_column& c) { return std::max(6, static_cast<int>(std::string_view(c.name).size())); }

/// The live view's table of a window's figures (rank order): a row per rank, or past
/// `fold_above` ranks three rows (min, median, max) whose cells say which rank has the value;
/// then the straggler line when there is one. Every line ends in '\n'.
/// (Not inline here: the definition, impl/live.ipp, is [[gnu::noinline]].)
std::string live_table(const std::vector<rank_figures>& window, std::size_t fold_above = 16);

/// Whether `out` is std::cerr or std::cout attached to a terminal.
LOOM_DECL bool is_terminal(const std::ostream* out);

/// Columns of the terminal the process writes to: stderr's, stdout's, stdin's or the
/// controlling terminal's (a program under mpirun writes to a pipe, but mpirun to the
/// terminal), else $COLUMNS, else 80.
LOOM_DECL int terminal_columns();

/// One fit's live view (see the top of this file) and its step recorder. Every rank makes one
/// with the same every_s and calls step() after every optimizer step and finish() before the
/// figures are gathered at the end; rank 0 passes the stream to draw on (the others null).
class live_view {
 public:
  /// Steps before the first exchange (the first window: its time on rank 0 sets the interval).
  static constexpr std::size_t first_exchange = 10;
  /// The most steps between exchanges.
  static constexpr std::size_t max_interval = 1'000'000;

  /// every_s: seconds between exchanges (0: no live view; the recorder runs regardless).
  /// Throws loom::invalid_argument for a negative or non-finite every_s (on every rank alike).
  live_view(double every_s, rank_figures& fig, std::ostream* out, progress_mode mode);

  /// every_s as every rank sees it: parsed back from the text fit's job check compares
  /// (std::to_string), so ranks whose options passed the check compute the same intervals.
  static double canonical(double every_s) { return std::isfinite(every_s) ? std::stod(std::to_string(every_s)) : every_s; }

  /// After each optimizer step of epoch `epoch` (0-based): records it and, at an exchange
  /// step, calls gather() — every rank's figures on every rank (the engine's gather_figures,
  /// collective) — and draws on rank 0. The exchange counts as waiting (rank_figures::wait_s).
  template <class Gather>
  void step(std::size_t epoch, Gather&& gather) {
    recorder_.record();
    if (every_s_ <= 0 || ++steps_ != next_) return;
    const clock::time_point start = clock::now();
    const double seconds = fig_->seconds;
    clock::time_point gathered;
    {
      timed wait(*fig_, &rank_figures::wait_s);
      before_gather(start);
      std::vector<rank_figures> all = gather();
      fig_->seconds = seconds;
      gathered = clock::now();
      after_gather(std::move(all), epoch);
    }
    gather_s_ += seconds_between(start, gathered);
    exchange_s_ += seconds_between(start, clock::now());
  }

  /// After a recovery (the world changed, and replacements may have joined with a fresh view):
  /// the exchanges start over as in a new view, so that every rank exchanges at the same steps.
  void restart();

  /// Fills this rank's whole-fit medians and resident memory into its figures.
  void finish();

  /// Exchanges so far, seconds spent in them on this rank (all of it, and in the gather alone:
  /// the rest is the drawing), the current interval in steps.
  std::size_t exchanges() const { return exchanges_; }
  double exchange_seconds() const { return exchange_s_; }
  double gather_seconds() const { return gather_s_; }
  std::size_t interval() const { return interval_; }
  /// The last window's figures (rank order; on every rank) and its table as drawn.
  const std::vector<rank_figures>& last_window() const { return window_; }
  /// The straggler of the last window (none before the first exchange); the same on every rank.
  const straggler& last_straggler() const { return straggler_; }

 private:
  /// This rank's part of the exchange: the window's medians, its memory, its seconds so far.
  void before_gather(clock::time_point now);

  /// The windows, the next interval (from rank 0's seconds: the same numbers on every rank)
  /// and, on rank 0, the drawing.
  void after_gather(std::vector<rank_figures> all, std::size_t epoch);

  void draw(std::size_t epoch);

  double every_s_;
  rank_figures* fig_;
  step_recorder recorder_;
  std::ostream* out_;
  bool redraw_;
  clock::time_point start_ = clock::now();
  std::size_t steps_ = 0, last_step_ = 0, next_ = first_exchange, interval_ = first_exchange;
  std::size_t exchanges_ = 0;
  double exchange_s_ = 0, gather_s_ = 0;
  std::vector<rank_figures> before_, window_;
  straggler straggler_;
  std::size_t drawn_lines_ = 0, drawn_epoch_ = 0;
};

}  // namespace loom::monitor

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/live.ipp"
#endif
