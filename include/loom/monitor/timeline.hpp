// SPDX-License-Identifier: Apache-2.0
#pragma once
// The timeline of a run: the spans every engine already times (monitor::timed: compute, data,
// exposed communication, waits, a stage's bubble), the trainer's steps and checkpoints, the
// passes (forward, backward and backward per layer, the optimizer), each gradient bucket's
// collective from post to completion, pipeline sends and receives, and sampled counters —
// recorded per rank while a timeline is attached to the thread (timeline_scope), and written as
// Chrome trace JSON (the `traceEvents` format that Perfetto and chrome://tracing open): one file
// per rank and one merged file with every rank as a process, their clocks aligned on the
// collective that starts fit. Nothing is recorded, and nothing costs more than a thread-local
// load, when none is attached.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/monitor/figures.hpp"

namespace loom::monitor {

/// What a span is: a figure of rank_figures (its index in figure_fields: the seconds it adds
/// to), or one of these, recorded on the timeline only.
enum class span_kind : std::uint32_t {
  step = static_cast<std::uint32_t>(figure_fields.size()),  ///< one optimizer step, all of it
  forward,          ///< a forward pass (and the loss)
  backward,         ///< a backward pass
  layer_backward,   ///< backward through one layer (index: the layer), where the engine sees it: the last micro-step
  optimizer,        ///< clipping and the optimizer's update
  checkpoint,       ///< writing (or starting to write) a checkpoint
  collective,       ///< a gradient bucket's allreduce from its post to its completion (index: bucket; peer: ranks; value: bytes)
  send,             ///< posting a pipeline send (index: micro-batch; peer: the stage; value: bytes)
  receive,          ///< posting a pipeline receive (likewise)
  counter,          ///< a sampled value at one instant (index: a monitor::counter; value)
  straggler,        ///< the live view named a straggler at this instant (index: its rank; peer: 0 compute, 1 data; value: its score)
  end_
};
inline constexpr std::uint32_t step_span = static_cast<std::uint32_t>(span_kind::step);

/// The values the timeline samples as counters (Chrome trace "C" events), by index.
enum class counter : std::uint32_t {
  rss_bytes,             ///< resident memory
  peak_rss_bytes,        ///< the most resident at once so far
  cpu_percent,           ///< the process's CPU time over the last sample's interval, percent of one core
  nic_received_bytes_per_s,  ///< bytes per second received by the host's network interfaces (loopback excluded)
  nic_sent_bytes_per_s,      ///< likewise sent
  gpu_memory_bytes,      ///< the device's memory in use (NVML), where there is one
  gpu_utilization_percent,  ///< the device's utilisation (NVML)
  bus_gbps,              ///< a collective's bus bandwidth, GB/s, at its completion
  gflops,                ///< FLOP/s achieved in compute over the last sample's interval, in GFLOP/s
  end_
};
inline constexpr std::array<std::string_view, static_cast<std::size_t>(counter::end_)> counter_names{
    "rss_bytes", "peak_rss_bytes", "cpu_percent", "nic_received_bytes_per_s", "nic_sent_bytes_per_s",
    "gpu_memory_bytes", "gpu_utilization_percent", "bus_GBps", "GFLOPs"};

/// One span of one rank, in nanoseconds since the rank's zero (the exit of fit's first
/// collective), the optimizer step it belongs to, and what the kind says of index, peer and
/// value (-1, -1, 0 where it says nothing).
struct span_event {
  std::int64_t start_ns = 0, duration_ns = 0;
  std::uint32_t kind = 0;  // figure_fields index, or a span_kind
  std::uint32_t step = 0;
  std::int32_t index = -1, peer = -1;
  double value = 0;
};

/// The spans of one rank during one fit. At most `capacity` are kept; later ones are counted
/// in dropped() and not stored, so a long run cannot exhaust memory.
class timeline {
 public:
  explicit timeline(std::size_t capacity = std::size_t{1} << 20) : capacity_(capacity) {}

  /// This rank's zero: the spans' times are relative to it.
  void set_zero(clock::time_point zero) noexcept { zero_ = zero; }
  void set_step(std::uint32_t step) noexcept { step_ = step; }

  // Out of line (impl/timeline.ipp; compiled once with loom::compiled): every timed scope of
  // every engine calls it.
  void add(std::uint32_t kind, clock::time_point a, clock::time_point b, std::int32_t index = -1,
           std::int32_t peer = -1, double value = 0);
  void add(span_kind kind, clock::time_point a, clock::time_point b, std::int32_t index = -1, std::int32_t peer = -1,
           double value = 0) {
    add(static_cast<std::uint32_t>(kind), a, b, index, peer, value);
  }
  /// A counter's value at t.
  void sample(counter c, clock::time_point t, double value) {
    add(span_kind::counter, t, t, static_cast<std::int32_t>(c), -1, value);
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
inline void record_span(span_kind kind, clock::time_point a, clock::time_point b, std::int32_t index = -1,
                        std::int32_t peer = -1, double value = 0) {
  if (timeline* t = current_timeline()) t->add(kind, a, b, index, peer, value);
}

/// A gradient bucket's collective: posted at `posted`, seen complete at `done`, `bytes` of
/// payload over `ranks` ranks. Recorded (as a span on the bucket's own track and its bus
/// bandwidth as a counter) only while a timeline is attached.
inline void record_collective(std::int32_t bucket, int ranks, double bytes, clock::time_point posted, clock::time_point done) {
  timeline* t = current_timeline();
  if (!t) return;
  t->add(span_kind::collective, posted, done, bucket, ranks, bytes);
  const double s = seconds_between(posted, done);
  if (s > 0 && ranks > 1) t->sample(counter::bus_gbps, done, bytes / s * 2.0 * (ranks - 1) / ranks / 1e9);
}

/// A span on the timeline only (no figure): `{ monitor::span s(monitor::span_kind::forward); ... }`.
/// With no timeline attached it costs a thread-local load and nothing else (no clock read).
class span {
 public:
  explicit span(span_kind kind, std::int32_t index = -1) noexcept : t_(current_timeline()), kind_(kind), index_(index) {
    if (t_) start_ = clock::now();
  }
  span(const span&) = delete;
  span& operator=(const span&) = delete;
  ~span() { stop(); }
  void stop() {
    if (t_) t_->add(kind_, start_, clock::now(), index_);
    t_ = nullptr;
  }

 private:
  timeline* t_;
  span_kind kind_;
  std::int32_t index_;
  clock::time_point start_{};
};

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
/// "comm_exposed", "wait", "data", "bubble", ...), or the span_kind's ("step", "forward",
/// "backward", "optimizer", "checkpoint", "allreduce", "send", "receive", "counter").
LOOM_DECL std::string span_name(std::uint32_t kind);

namespace detail {
/// The track (Chrome trace tid) of a bucket's collectives: its own, so that buckets in flight
/// together do not overlap on one thread (the format wants complete events nested per thread).
/// Far from every pid: Perfetto's importer takes a process's tid 0 as its main thread, tid =
/// pid, so a bucket on tid r of rank r would land on rank r's steps (measured with Perfetto
/// v52: its spans dropped as overlapping).
inline constexpr int first_bucket_track = 1'000'000;
inline int bucket_track(std::int32_t bucket) { return first_bucket_track + bucket; }
}  // namespace detail

/// Chrome trace JSON of several ranks' spans: ranks[r] is rank first_rank + r's, shown as
/// process first_rank + r ("rank r"). Per rank:
/// - its spans on thread 0 ("steps") as complete ("X") events in microseconds, each with its
///   step (a step holds its phases; spans of one thread nest, as the format asks);
/// - each gradient bucket's collectives on a thread of their own ("bucket b"): X events from
///   post to completion with the step, bytes, algorithm and bus bandwidth (bus = algorithm ×
///   2 (n-1)/n for an allreduce) and, where several ranks are in the file, the rank's arrival:
///   how much later than the earliest rank it posted that collective (`late_ms`, on clocks
///   aligned at fit's first collective), and a flow ("s" to "f") from the post to where the
///   rank saw it complete, on thread 0;
/// - pipeline sends and receives as the X events of their posts, with micro-batch, peer stage
///   and bytes;
/// - the sampled counters ("C" events: memory, CPU, network, device, bus bandwidth, GFLOP/s).
/// (Not inline here: its definition, impl/timeline.ipp, is [[gnu::noinline]], which gcc refuses
/// on an inline declaration.)
std::string chrome_trace(const std::vector<std::vector<span_event>>& ranks, const std::vector<std::size_t>& dropped,
                         int first_rank = 0);

/// Writes text to path through a temporary file renamed over it (a reader never sees half).
/// Throws loom::io_error naming the path.
LOOM_DECL void write_file_atomically(const std::string& path, const std::string& text);

/// Creates the folder `path` is in, and the folders above it, where missing (as checkpoints'
/// and TensorBoard's folders are created). Throws loom::io_error naming `who` and the folder
/// when it cannot.
LOOM_DECL void create_parent_directories(const std::string& path, const char* who);

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
  constexpr std::size_t k = 7;  // start, duration, kind, step, index, peer, value
  std::vector<double> flat(k * std::max<std::size_t>(longest, 1), 0.0), all(flat.size() * ranks);
  for (std::size_t i = 0; i < mine.events().size(); ++i) {
    const span_event& e = mine.events()[i];
    double* v = flat.data() + k * i;
    v[0] = static_cast<double>(e.start_ns), v[1] = static_cast<double>(e.duration_ns), v[2] = e.kind, v[3] = e.step;
    v[4] = e.index, v[5] = e.peer, v[6] = e.value;
  }
  comm.allgather(flat.data(), all.data(), flat.size());
  std::vector<std::vector<span_event>> out;
  dropped.clear();
  if (comm.rank() != 0) return out;
  out.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::size_t n = static_cast<std::size_t>(counts[2 * r]);
    dropped.push_back(static_cast<std::size_t>(counts[2 * r + 1]));
    const double* all_r = all.data() + r * flat.size();
    for (std::size_t i = 0; i < n; ++i) {
      const double* v = all_r + k * i;
      out[r].push_back({static_cast<std::int64_t>(v[0]), static_cast<std::int64_t>(v[1]), static_cast<std::uint32_t>(v[2]),
                        static_cast<std::uint32_t>(v[3]), static_cast<std::int32_t>(v[4]), static_cast<std::int32_t>(v[5]),
                        v[6]});
    }
  }
  return out;
}

}  // namespace loom::monitor

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/timeline.ipp"
#endif
