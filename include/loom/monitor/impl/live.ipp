// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of live.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/monitor/live.hpp"

namespace loom::monitor {

[[gnu::noinline]] LOOM_DECL void step_recorder::medians(std::size_t k, rank_figures& into) const {
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

LOOM_DECL double step_recorder::median(std::vector<double>& v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

LOOM_DECL column_fold fold_column(const std::vector<double>& v) {
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

LOOM_DECL rank_figures window_of(const rank_figures& now, const rank_figures& before) {
  rank_figures w = now;
  for (double rank_figures::* m : {&rank_figures::compute_s, &rank_figures::comm_s, &rank_figures::comm_exposed_s,
                                   &rank_figures::wait_s, &rank_figures::data_s, &rank_figures::bytes_sent,
                                   &rank_figures::samples, &rank_figures::seconds, &rank_figures::bubble_s,
                                   &rank_figures::comm_bytes, &rank_figures::bus_bytes, &rank_figures::flops})
    w.*m = now.*m - before.*m;
  return w;
}

[[gnu::noinline]] LOOM_DECL std::string live_table(const std::vector<rank_figures>& window, std::size_t fold_above) {
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

LOOM_DECL bool is_terminal(const std::ostream* out) {
  return out == &std::cerr ? ::isatty(2) : out == &std::cout ? ::isatty(1) : false;
}

LOOM_DECL int terminal_columns() {
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

[[gnu::noinline]] LOOM_DECL live_view::live_view(double every_s, rank_figures& fig, std::ostream* out, progress_mode mode)
      : every_s_(canonical(every_s)), fig_(&fig), recorder_(fig), out_(out),
        redraw_(mode == progress_mode::bar || (mode == progress_mode::automatic && is_terminal(out))) {
  if (!(every_s >= 0) || !std::isfinite(every_s))
    throw invalid_argument("loom::fit_options: live_every_s must be finite and >= 0 (0: no live view), got " +
                           std::to_string(every_s));
  if (mode == progress_mode::off) out_ = nullptr;
}

LOOM_DECL void live_view::restart() {
  steps_ = last_step_ = 0;
  next_ = interval_ = first_exchange;
  before_.clear();
}

LOOM_DECL void live_view::finish() {
  recorder_.medians(recorder_.recorded(), *fig_);
  fig_->resident_bytes = sample_process().rss_bytes;
}

[[gnu::noinline]] LOOM_DECL void live_view::before_gather(clock::time_point now) {
  recorder_.medians(steps_ - last_step_, *fig_);
  fig_->resident_bytes = sample_process().rss_bytes;
  fig_->seconds = seconds_between(start_, now);
}

[[gnu::noinline]] LOOM_DECL void live_view::after_gather(std::vector<rank_figures> all, std::size_t epoch) {
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

LOOM_DECL void live_view::draw(std::size_t epoch) {
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
}  // namespace loom::monitor
