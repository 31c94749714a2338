// SPDX-License-Identifier: Apache-2.0
#pragma once
// The timeline of a run: the spans every engine already times (monitor::timed: compute, data,
// exposed communication, waits, a stage's bubble) and the trainer's steps, recorded per rank
// while a timeline is attached to the thread (timeline_scope), and written as Chrome trace JSON
// (the `traceEvents` format that Perfetto and chrome://tracing open): one file per rank and one
// merged file with every rank as a process, their clocks aligned on the collective that starts
// fit. Nothing is recorded, and nothing costs more than a thread-local load, when none is
// attached.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/monitor/figures.hpp"

namespace loom::monitor {

/// What a span is: a figure of rank_figures (its index in figure_fields) or a whole step.
inline constexpr std::uint32_t step_span = static_cast<std::uint32_t>(figure_fields.size());

/// One span of one rank, in nanoseconds since the rank's zero (the exit of fit's first
/// collective), and the optimizer step it belongs to.
struct span_event {
  std::int64_t start_ns = 0, duration_ns = 0;
  std::uint32_t kind = 0;  // figure_fields index, or step_span
  std::uint32_t step = 0;
};

/// The spans of one rank during one fit. At most `capacity` are kept; later ones are counted
/// in dropped() and not stored, so a long run cannot exhaust memory.
class timeline {
 public:
  explicit timeline(std::size_t capacity = std::size_t{1} << 20) : capacity_(capacity) {}

  /// This rank's zero: the spans' times are relative to it.
  void set_zero(clock::time_point zero) noexcept { zero_ = zero; }
  void set_step(std::uint32_t step) noexcept { step_ = step; }

  // Out of line: every timed scope of every engine calls it, and a vector's growth inlined
  // into each would cost compile time and code size for nothing.
  [[gnu::noinline]] void add(std::uint32_t kind, clock::time_point a, clock::time_point b) {
    if (events_.size() >= capacity_) {
      ++dropped_;
      return;
    }
    events_.push_back({ns(a), ns(b) - ns(a), kind, step_});
  }

  const std::vector<span_event>& events() const noexcept { return events_; }
  std::size_t dropped() const noexcept { return dropped_; }

 private:
  std::int64_t ns(clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - zero_).count();
  }
  std::size_t capacity_;
  clock::time_point zero_ = clock::now();
  std::uint32_t step_ = 0;
  std::vector<span_event> events_;
  std::size_t dropped_ = 0;
};

namespace detail {
inline timeline*& current_timeline() noexcept {
  thread_local timeline* t = nullptr;
  return t;
}
}  // namespace detail

/// The timeline the calling thread records into, or null.
inline timeline* current_timeline() noexcept { return detail::current_timeline(); }

/// Attaches t to the calling thread for the scope's life (t null: detaches nothing).
class timeline_scope {
 public:
  explicit timeline_scope(timeline* t) noexcept : previous_(detail::current_timeline()) {
    if (t) detail::current_timeline() = t;
  }
  timeline_scope(const timeline_scope&) = delete;
  timeline_scope& operator=(const timeline_scope&) = delete;
  ~timeline_scope() { detail::current_timeline() = previous_; }

 private:
  timeline* previous_;
};

/// Records [a, b) as a span of `kind` on the calling thread's timeline, if one is attached.
inline void record_span(std::uint32_t kind, clock::time_point a, clock::time_point b) {
  if (timeline* t = current_timeline()) t->add(kind, a, b);
}

/// Index of figure m in figure_fields.
inline std::uint32_t field_index(double rank_figures::* m) noexcept {
  for (std::uint32_t i = 0; i < figure_fields.size(); ++i)
    if (figure_fields[i].member == m) return i;
  return step_span;
}

/// Adds the seconds of a scope to figure m of f, and records the scope as a span of that
/// figure on the calling thread's timeline when one is attached:
/// `{ monitor::timed t(fig, &rank_figures::compute_s); ...work... }`. Two clock reads (about
/// 40 ns) and a thread-local load: cheap enough to stay on in every step. stop() ends the span
/// early (then the destructor does nothing); it returns the seconds added.
class timed {
 public:
  timed(rank_figures& f, double rank_figures::* m) noexcept : into_(&(f.*m)), kind_(field_index(m)), start_(clock::now()) {}
  timed(const timed&) = delete;
  timed& operator=(const timed&) = delete;
  ~timed() { stop(); }
  double stop() {
    if (!into_) return 0;
    const auto end = clock::now();
    const double s = seconds_between(start_, end);
    *into_ += s;
    into_ = nullptr;
    record_span(kind_, start_, end);
    return s;
  }
  clock::time_point start() const noexcept { return start_; }

 private:
  double* into_;
  std::uint32_t kind_;
  clock::time_point start_;
};

/// The name a span kind has in the trace: the figure's name without "_s" ("compute",
/// "comm_exposed", "wait", "data", "bubble", ...) or "step".
inline std::string span_name(std::uint32_t kind) {
  if (kind >= figure_fields.size()) return "step";
  std::string n(figure_fields[kind].name);
  if (n.size() > 2 && n.compare(n.size() - 2, 2, "_s") == 0) n.resize(n.size() - 2);
  return n;
}

/// Chrome trace JSON of several ranks' spans: ranks[r] is rank r's, shown as process r
/// ("rank r"), its spans on one thread as complete ("X") events in microseconds, each with its
/// step. Spans of one rank nest (a step holds its phases), as the format asks of one thread.
inline std::string chrome_trace(const std::vector<std::vector<span_event>>& ranks, const std::vector<std::size_t>& dropped,
                                int first_rank = 0) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  char buf[256];
  auto emit = [&](const std::string& event) {
    if (!first) out += ",\n";
    first = false;
    out += event;
  };
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int pid = first_rank + static_cast<int>(i);
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", pid, pid);
    emit(buf);
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}", pid, pid);
    emit(buf);
    if (i < dropped.size() && dropped[i] > 0) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"spans_dropped\",\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":0,\"args\":{\"count\":%zu}}", pid,
                    dropped[i]);
      emit(buf);
    }
    // Outer spans first where two start together, so viewers nest them.
    std::vector<span_event> ev = ranks[i];
    std::stable_sort(ev.begin(), ev.end(), [](const span_event& a, const span_event& b) {
      return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.duration_ns > b.duration_ns;
    });
    for (const span_event& e : ev) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"%s\",\"cat\":\"loom\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,"
                    "\"args\":{\"step\":%u}}",
                    span_name(e.kind).c_str(), pid, static_cast<double>(e.start_ns) / 1e3,
                    static_cast<double>(e.duration_ns) / 1e3, e.step);
      emit(buf);
    }
  }
  out += "\n]}\n";
  return out;
}

/// Writes text to path through a temporary file renamed over it (a reader never sees half).
/// Throws loom::io_error naming the path.
inline void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream o(tmp, std::ios::trunc | std::ios::binary);
    o << text;
    o.flush();
    if (!o) {
      const int e = errno;
      std::remove(tmp.c_str());
      throw io_error("loom::monitor: cannot write " + tmp + ": " + std::strerror(e) + " (" + path + " is left as it was)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw io_error("loom::monitor: cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
  }
}

/// Every rank's spans on rank 0 (collective over comm): the counts first, then the events as
/// doubles padded to the longest. Returns them on rank 0 (empty elsewhere).
template <class Comm>
std::vector<std::vector<span_event>> gather_timelines(Comm& comm, const timeline& mine, std::vector<std::size_t>& dropped) {
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  double counts_mine[2] = {static_cast<double>(mine.events().size()), static_cast<double>(mine.dropped())};
  std::vector<double> counts(2 * ranks);
  comm.allgather(counts_mine, counts.data(), 2);
  std::size_t longest = 0;
  for (std::size_t r = 0; r < ranks; ++r) longest = std::max(longest, static_cast<std::size_t>(counts[2 * r]));
  constexpr std::size_t k = 4;  // start, duration, kind, step
  std::vector<double> flat(k * std::max<std::size_t>(longest, 1), 0.0), all(flat.size() * ranks);
  for (std::size_t i = 0; i < mine.events().size(); ++i) {
    const span_event& e = mine.events()[i];
    flat[k * i] = static_cast<double>(e.start_ns);
    flat[k * i + 1] = static_cast<double>(e.duration_ns);
    flat[k * i + 2] = e.kind;
    flat[k * i + 3] = e.step;
  }
  comm.allgather(flat.data(), all.data(), flat.size());
  std::vector<std::vector<span_event>> out;
  dropped.clear();
  if (comm.rank() != 0) return out;
  out.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::size_t n = static_cast<std::size_t>(counts[2 * r]);
    dropped.push_back(static_cast<std::size_t>(counts[2 * r + 1]));
    const double* v = all.data() + r * flat.size();
    for (std::size_t i = 0; i < n; ++i)
      out[r].push_back({static_cast<std::int64_t>(v[k * i]), static_cast<std::int64_t>(v[k * i + 1]),
                        static_cast<std::uint32_t>(v[k * i + 2]), static_cast<std::uint32_t>(v[k * i + 3])});
  }
  return out;
}

}  // namespace loom::monitor
