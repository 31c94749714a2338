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
  [[gnu::noinline]] void medians(std::size_t k, rank_figures& into) const {
    k = std::min({k, recorded_, capacity});
    std::vector<double> total(k), compute(k), data(k);
    for (std::size_t i = 0; i < k; ++i) {
      const auto [c, d] = steps_[(recorded_ - 1 - i) % capacity];
      total[i] = c + d, compute[i] = c, data[i] = d;
    }
    into.step_s = median(total);
    into.step_compute_s = median(compute);
    into.step_data_s = median(data);
  }

  /// The lower median of v (an element of v; 0 when v is empty). Reorders v.
  static double median(std::vector<double>& v) {
    if (v.empty()) return 0;
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
  }

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

inline column_fold fold_column(const std::vector<double>& v) {
  column_fold f;
  if (v.empty()) return f;
  std::vector<int> order(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[static_cast<std::size_t>(a)] < v[static_cast<std::size_t>(b)]; });
  const auto at = [&](std::size_t i) { return std::pair{v[static_cast<std::size_t>(order[i])], order[i]}; };
  std::tie(f.min, f.min_rank) = at(0);
  std::tie(f.median, f.median_rank) = at((v.size() - 1) / 2);
  // The lowest rank holding the maximum: the first of the equal values at the end.
  std::size_t last = v.size() - 1;
  while (last > 0 && v[static_cast<std::size_t>(order[last - 1])] == v[static_cast<std::size_t>(order[last])]) --last;
  std::tie(f.max, f.max_rank) = at(last);
  return f;
}

/// The figures of a window: now - before for the figures that add up over a run (times, bytes,
/// samples, seconds); the rest (medians, memory, stage) as they are now.
inline rank_figures window_of(const rank_figures& now, const rank_figures& before) {
  rank_figures w = now;
  for (double rank_figures::* m : {&rank_figures::compute_s, &rank_figures::comm_s, &rank_figures::comm_exposed_s,
                                   &rank_figures::wait_s, &rank_figures::data_s, &rank_figures::bytes_sent,
                                   &rank_figures::samples, &rank_figures::seconds, &rank_figures::bubble_s,
                                   &rank_figures::comm_bytes, &rank_figures::bus_bytes, &rank_figures::flops})
    w.*m = now.*m - before.*m;
  return w;
}

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
[[gnu::noinline]] inline std::string live_table(const std::vector<rank_figures>& window, std::size_t fold_above = 16) {
  const std::vector<double> score = straggler_scores(window);
  const std::size_t n = window.size();
  std::string out;
  char cell[64];
  if (n <= fold_above) {
    out = "rank";
    for (const auto& c : live_columns) std::snprintf(cell, sizeof cell, "  %*s", column_width(c), c.name), out += cell;
    out += "\n";
    for (std::size_t r = 0; r < n; ++r) {
      std::snprintf(cell, sizeof cell, "%4zu", r);
      out += cell;
      for (const auto& c : live_columns) {
        char v[32];
        std::snprintf(v, sizeof v, c.format, c.value(window[r], score[r]));
        std::snprintf(cell, sizeof cell, "  %*s", column_width(c), v);
        out += cell;
      }
      out += "\n";
    }
  } else {
    std::snprintf(cell, sizeof cell, "%-6s", (std::to_string(n) + "r").c_str());
    out = cell;
    for (const auto& c : live_columns) std::snprintf(cell, sizeof cell, "  %14s", c.name), out += cell;
    out += "\n";
    std::vector<column_fold> folds;
    for (const auto& c : live_columns) {
      std::vector<double> v(n);
      for (std::size_t r = 0; r < n; ++r) v[r] = c.value(window[r], score[r]);
      folds.push_back(fold_column(v));
    }
    for (int row = 0; row < 3; ++row) {
      std::snprintf(cell, sizeof cell, "%-6s", row == 0 ? "min" : row == 1 ? "median" : "max");
      out += cell;
      for (std::size_t i = 0; i < live_columns.size(); ++i) {
        const column_fold& f = folds[i];
        const double v = row == 0 ? f.min : row == 1 ? f.median : f.max;
        const int r = row == 0 ? f.min_rank : row == 1 ? f.median_rank : f.max_rank;
        char value[32];
        std::snprintf(value, sizeof value, live_columns[i].format, v);
        std::snprintf(cell, sizeof cell, "  %9s r%-3d", value, r);
        out += cell;
      }
      out += "\n";
    }
  }
  if (const straggler s = find_straggler(window)) out += describe(s, window) + "\n";
  return out;
}

/// Whether `out` is std::cerr or std::cout attached to a terminal.
inline bool is_terminal(const std::ostream* out) {
  return out == &std::cerr ? ::isatty(2) : out == &std::cout ? ::isatty(1) : false;
}

/// Columns of the terminal the process writes to: stderr's, stdout's, stdin's or the
/// controlling terminal's (a program under mpirun writes to a pipe, but mpirun to the
/// terminal), else $COLUMNS, else 80.
inline int terminal_columns() {
  winsize w{};
  for (int fd : {2, 1, 0})
    if (::ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  if (const int tty = ::open("/dev/tty", O_RDONLY | O_CLOEXEC); tty >= 0) {
    const bool ok = ::ioctl(tty, TIOCGWINSZ, &w) == 0 && w.ws_col > 0;
    ::close(tty);
    if (ok) return w.ws_col;
  }
  if (const char* c = std::getenv("COLUMNS"); c && std::atoi(c) > 0) return std::atoi(c);
  return 80;
}

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
  [[gnu::noinline]] live_view(double every_s, rank_figures& fig, std::ostream* out, progress_mode mode)
      : every_s_(canonical(every_s)), fig_(&fig), recorder_(fig), out_(out),
        redraw_(mode == progress_mode::bar || (mode == progress_mode::automatic && is_terminal(out))) {
    if (!(every_s >= 0) || !std::isfinite(every_s))
      throw invalid_argument("loom::fit_options: live_every_s must be finite and >= 0 (0: no live view), got " +
                             std::to_string(every_s));
    if (mode == progress_mode::off) out_ = nullptr;
  }

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
  void restart() {
    steps_ = last_step_ = 0;
    next_ = interval_ = first_exchange;
    before_.clear();
  }

  /// Fills this rank's whole-fit medians and resident memory into its figures.
  void finish() {
    recorder_.medians(recorder_.recorded(), *fig_);
    fig_->resident_bytes = sample_process().rss_bytes;
  }

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
  [[gnu::noinline]] void before_gather(clock::time_point now) {
    recorder_.medians(steps_ - last_step_, *fig_);
    fig_->resident_bytes = sample_process().rss_bytes;
    fig_->seconds = seconds_between(start_, now);
  }

  /// The windows, the next interval (from rank 0's seconds: the same numbers on every rank)
  /// and, on rank 0, the drawing.
  [[gnu::noinline]] void after_gather(std::vector<rank_figures> all, std::size_t epoch) {
    if (before_.size() != all.size()) before_.assign(all.size(), rank_figures{});
    window_.resize(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) window_[r] = window_of(all[r], before_[r]);
    straggler_ = find_straggler(window_);
    before_ = std::move(all);
    const std::size_t steps = steps_ - last_step_;
    const double per_step = window_[0].seconds / static_cast<double>(steps);
    interval_ = per_step > 0 ? static_cast<std::size_t>(std::clamp(std::llround(every_s_ / per_step), 1LL,
                                                                    static_cast<long long>(max_interval)))
                             : steps;
    last_step_ = steps_;
    next_ = steps_ + interval_;
    ++exchanges_;
    if (out_) draw(epoch);
  }

  void draw(std::size_t epoch) {
    // The cost of the exchanges before this one (this one is not over).
    char head[200];
    const double done = static_cast<double>(std::max<std::size_t>(exchanges_ - 1, 1));
    std::snprintf(head, sizeof head,
                  "live: step %zu, %.1f s, %zu rank(s); exchange every %zu steps, %.0f us (gather %.0f us) each\n",
                  steps_, before_[0].seconds, window_.size(), interval_, 1e6 * exchange_s_ / done,
                  1e6 * gather_s_ / done);
    const std::string table = live_table(window_);
    if (!redraw_) {  // lines, each marked as the live view's among the progress lines
      std::string text = head;
      for (std::size_t at = 0; at < table.size();) {
        const std::size_t nl = table.find('\n', at);
        text += "live: " + table.substr(at, nl + 1 - at);
        at = nl + 1;
      }
      *out_ << text << std::flush;
      return;
    }
    // On a terminal: back over the previous drawing (unless an epoch's progress bar ended
    // since, leaving its line below it) and clear to the end of the screen; the progress bar
    // redraws itself on the line below. Lines are cut to the terminal's width, so that none
    // wraps and the count of lines to go back over holds.
    std::string text = "\r";
    if (drawn_lines_ && epoch == drawn_epoch_) text += "\033[" + std::to_string(drawn_lines_) + "A";
    text += "\033[J";
    const std::size_t width = static_cast<std::size_t>(std::max(terminal_columns() - 1, 20));
    const std::string all = head + table;
    drawn_lines_ = 0;
    for (std::size_t at = 0; at < all.size(); ++drawn_lines_) {
      const std::size_t nl = all.find('\n', at);
      text += all.substr(at, std::min(nl - at, width)) + "\n";
      at = nl + 1;
    }
    *out_ << text << std::flush;
    drawn_epoch_ = epoch;
  }

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
