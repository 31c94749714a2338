// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of timeline.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <filesystem>

#include "loom/monitor/timeline.hpp"

namespace loom::monitor {

// Out of line: every timed scope of every engine calls it, and a vector's growth inlined into
// each would cost compile time and code size for nothing.
LOOM_DECL void timeline::add(std::uint32_t kind, clock::time_point a, clock::time_point b, std::int32_t index,
                             std::int32_t peer, double value) {
  if (events_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  events_.push_back({ns(a), ns(b) - ns(a), kind, step_, index, peer, value});
}

LOOM_DECL std::string span_name(std::uint32_t kind) {
  if (kind < figure_fields.size()) {
    std::string n(figure_fields[kind].name);
    if (n.size() > 2 && n.compare(n.size() - 2, 2, "_s") == 0) n.resize(n.size() - 2);
    return n;
  }
  switch (static_cast<span_kind>(kind)) {
    case span_kind::step: return "step";
    case span_kind::forward: return "forward";
    case span_kind::backward: return "backward";
    case span_kind::layer_backward: return "backward layer";
    case span_kind::optimizer: return "optimizer";
    case span_kind::checkpoint: return "checkpoint";
    case span_kind::collective: return "allreduce";
    case span_kind::send: return "send";
    case span_kind::receive: return "receive";
    case span_kind::counter: return "counter";
    case span_kind::straggler: return "straggler";
    case span_kind::end_: break;
  }
  return "span " + std::to_string(kind);
}

[[gnu::noinline]] LOOM_DECL std::string chrome_trace(const std::vector<std::vector<span_event>>& ranks,
                                                     const std::vector<std::size_t>& dropped, int first_rank) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  char buf[512];
  auto emit = [&](const char* event) {
    if (!first) out += ",\n";
    first = false;
    out += event;
  };
  constexpr auto collective = static_cast<std::uint32_t>(span_kind::collective);
  // Arrivals: the earliest post of each (step, bucket, occurrence) over the ranks in the file
  // (a step redone after a recovery is a second occurrence).
  using key = std::tuple<std::uint32_t, std::int32_t, std::uint32_t>;
  std::map<key, std::int64_t> earliest;
  auto occurrences = [](const std::vector<span_event>& ev, auto&& each) {
    std::map<std::pair<std::uint32_t, std::int32_t>, std::uint32_t> seen;
    for (const span_event& e : ev)
      if (e.kind == collective) each(e, key{e.step, e.index, seen[{e.step, e.index}]++});
  };
  if (ranks.size() > 1)
    for (const auto& ev : ranks)
      occurrences(ev, [&](const span_event& e, const key& k) {
        auto [it, fresh] = earliest.try_emplace(k, e.start_ns);
        if (!fresh) it->second = std::min(it->second, e.start_ns);
      });
  std::uint64_t flow_id = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int pid = first_rank + static_cast<int>(i);
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", pid, pid);
    emit(buf);
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}", pid, pid);
    emit(buf);
    std::snprintf(buf, sizeof buf, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"steps\"}}",
                  pid);
    emit(buf);
    std::set<std::int32_t> buckets;
    for (const span_event& e : ranks[i])
      if (e.kind == collective) buckets.insert(e.index);
    for (std::int32_t b : buckets) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"bucket %d\"}}", pid,
                    detail::bucket_track(b), b);
      emit(buf);
    }
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
    std::map<const span_event*, double> late_ms;
    if (!earliest.empty())
      occurrences(ev, [&](const span_event& e, const key& k) { late_ms[&e] = static_cast<double>(e.start_ns - earliest[k]) / 1e6; });
    for (const span_event& e : ev) {
      const double ts = static_cast<double>(e.start_ns) / 1e3, dur = static_cast<double>(e.duration_ns) / 1e3;
      switch (e.kind < figure_fields.size() ? span_kind::end_ : static_cast<span_kind>(e.kind)) {
        case span_kind::counter: {
          const auto c = static_cast<std::size_t>(e.index);
          if (c >= counter_names.size()) break;
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"%.*s\",\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"args\":{\"value\":%.9g}}",
                        static_cast<int>(counter_names[c].size()), counter_names[c].data(), pid, ts, e.value);
          emit(buf);
          break;
        }
        case span_kind::straggler:
          // An instant on the whole process, and the rank named as a counter (a track that
          // shows when, and whom, the live view named).
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"straggler: rank %d\",\"cat\":\"loom\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,\"tid\":0,"
                        "\"ts\":%.3f,\"args\":{\"rank\":%d,\"score\":%.4f,\"cause\":\"%s\",\"step\":%u}}",
                        e.index, pid, ts, e.index, e.value, e.peer == 1 ? "data" : "compute", e.step);
          emit(buf);
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"straggler_rank\",\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"args\":{\"value\":%d}}",
                        pid, ts, e.index);
          emit(buf);
          break;
        case span_kind::collective: {
          const double s = static_cast<double>(e.duration_ns) / 1e9, n = e.peer;
          const double alg = s > 0 ? e.value / s / 1e9 : 0, bus = n > 1 ? alg * 2 * (n - 1) / n : 0;
          std::string late;
          if (const auto it = late_ms.find(&e); it != late_ms.end()) late = ",\"late_ms\":" + std::to_string(it->second);
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"allreduce bucket %d\",\"cat\":\"bucket\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                        "\"dur\":%.3f,\"args\":{\"step\":%u,\"bucket\":%d,\"ranks\":%d,\"bytes\":%.0f,\"algbw_GBps\":%.6g,"
                        "\"busbw_GBps\":%.6g%s}}",
                        e.index, pid, detail::bucket_track(e.index), ts, dur, e.step, e.index, e.peer, e.value, alg, bus,
                        late.c_str());
          emit(buf);
          ++flow_id;
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"bucket %d\",\"cat\":\"bucket\",\"ph\":\"s\",\"id\":%llu,\"pid\":%d,\"tid\":0,\"ts\":%.3f}",
                        e.index, static_cast<unsigned long long>(flow_id), pid, ts);
          emit(buf);
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"bucket %d\",\"cat\":\"bucket\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%llu,\"pid\":%d,"
                        "\"tid\":0,\"ts\":%.3f}",
                        e.index, static_cast<unsigned long long>(flow_id), pid, ts + dur);
          emit(buf);
          break;
        }
        case span_kind::send:
        case span_kind::receive:
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"%s\",\"cat\":\"loom\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,"
                        "\"args\":{\"step\":%u,\"micro_batch\":%d,\"stage\":%d,\"bytes\":%.0f}}",
                        span_name(e.kind).c_str(), pid, ts, dur, e.step, e.index, e.peer, e.value);
          emit(buf);
          break;
        case span_kind::layer_backward:
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"backward layer %d\",\"cat\":\"loom\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,"
                        "\"dur\":%.3f,\"args\":{\"step\":%u,\"layer\":%d}}",
                        e.index, pid, ts, dur, e.step, e.index);
          emit(buf);
          break;
        default:
          std::snprintf(buf, sizeof buf,
                        "{\"name\":\"%s\",\"cat\":\"loom\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,"
                        "\"args\":{\"step\":%u}}",
                        span_name(e.kind).c_str(), pid, ts, dur, e.step);
          emit(buf);
      }
    }
  }
  out += "\n]}\n";
  return out;
}

LOOM_DECL void create_parent_directories(const std::string& path, const char* who) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw io_error(std::string(who) + ": cannot create the folder " + parent.string() + " for " + path + ": " + ec.message());
}

LOOM_DECL void write_file_atomically(const std::string& path, const std::string& text) {
  create_parent_directories(path, "loom::monitor");
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
}  // namespace loom::monitor
