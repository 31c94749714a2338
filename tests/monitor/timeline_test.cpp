// SPDX-License-Identifier: Apache-2.0
// The timeline (loom/monitor/timeline.hpp): spans recorded only while a timeline is attached,
// their names and nesting, the cap on their number, and the Chrome trace a fit writes for one
// rank and for several (each rank's own file and the merged one).

#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"
#include "monitor_common.hpp"

namespace {

namespace fs = std::filesystem;
using loom::monitor::span_event;
using loom_test::small_set;
using loom_test::text_of;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("loom_timeline_" + std::to_string(::getpid()) + "_" + name);
}

/// Whether the spans of one rank nest: each lies inside the span open around it or after it.
bool nested(std::vector<span_event> ev) {
  std::sort(ev.begin(), ev.end(), [](const span_event& a, const span_event& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.duration_ns > b.duration_ns;
  });
  std::vector<std::int64_t> open_ends;
  for (const auto& e : ev) {
    while (!open_ends.empty() && open_ends.back() <= e.start_ns) open_ends.pop_back();
    if (!open_ends.empty() && e.start_ns + e.duration_ns > open_ends.back()) return false;
    open_ends.push_back(e.start_ns + e.duration_ns);
  }
  return true;
}


}  // namespace

TEST_CASE("Spans are recorded only while a timeline is attached to the thread", "[monitor][timeline]") {
  loom::rank_figures f;
  loom::monitor::timeline t;
  { loom::monitor::timed a(f, &loom::rank_figures::compute_s); }
  CHECK(t.events().empty());
  CHECK(f.compute_s > 0);
  {
    loom::monitor::timeline_scope s(&t);
    { loom::monitor::timed a(f, &loom::rank_figures::wait_s); }
    std::thread([&] { loom::monitor::timed b(f, &loom::rank_figures::data_s); }).join();  // another thread: not this timeline
  }
  { loom::monitor::timed c(f, &loom::rank_figures::bubble_s); }
  REQUIRE(t.events().size() == 1);
  CHECK(loom::monitor::span_name(t.events()[0].kind) == "wait");
  CHECK(loom::monitor::span_name(loom::monitor::step_span) == "step");
  CHECK(loom::monitor::span_name(loom::monitor::field_index(&loom::rank_figures::comm_exposed_s)) == "comm_exposed");
}

TEST_CASE("A timeline keeps at most its capacity of spans and counts the rest", "[monitor][timeline]") {
  loom::monitor::timeline t(3);
  const auto now = loom::monitor::clock::now();
  for (int i = 0; i < 5; ++i) t.add(0, now, now);
  CHECK(t.events().size() == 3);
  CHECK(t.dropped() == 2);
  const std::string json = loom::monitor::chrome_trace({t.events()}, {t.dropped()});
  CHECK_THAT(json, Catch::Contains("\"spans_dropped\"") && Catch::Contains("\"count\":2"));
}

TEST_CASE("fit writes one step span per step, holding its phases", "[monitor][timeline]") {
  const fs::path trace = temp_path("one.json");
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.trace = trace.string();
  const auto r = t.fit(small_set(), o);
  const std::string json = text_of(trace);
  fs::remove(trace);
  CHECK(count(json, "\"name\":\"step\"") == r.steps);
  CHECK(count(json, "\"name\":\"data\"") == r.steps);
  CHECK(count(json, "\"name\":\"compute\"") == 2 * r.steps);  // the passes, and the optimizer step
  CHECK(count(json, "\"name\":\"process_name\"") == 1);
  CHECK_THAT(json, Catch::StartsWith("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  // Without a trace asked for, nothing is written and nothing is recorded.
  o.trace.clear();
  t.fit(small_set(), o);
  CHECK_FALSE(fs::exists(trace));
}

TEST_CASE("Several ranks write their own timelines and rank 0 the merged one, nested per rank", "[monitor][timeline]") {
  const fs::path trace = temp_path("dp.json");
  std::vector<std::vector<span_event>> mine(2);
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
        c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    loom::fit_options o = loom_test::one_epoch();
    o.trace = trace.string();
    t.fit(small_set(), o);
    // The same spans again, kept in memory to check their nesting.
    loom::monitor::timeline tl;
    {
      loom::monitor::timeline_scope s(&tl);
      o.trace.clear();
      o.max_steps = t.steps() + 5;
      t.fit(small_set(), o);
    }
    mine[static_cast<std::size_t>(c.rank())] = tl.events();
  });
  for (int r = 0; r < 2; ++r) {
    const fs::path own = trace.parent_path() / (trace.stem().string() + ".rank" + std::to_string(r) + ".json");
    const std::string json = text_of(own);
    fs::remove(own);
    CHECK(count(json, "\"name\":\"step\"") == 10);
    CHECK(count(json, "\"name\":\"comm_exposed\"") == 10);  // each step waits for its last bucket
    CHECK(count(json, "\"pid\":" + std::to_string(r)) > 0);
    CHECK(count(json, "\"pid\":" + std::to_string(1 - r)) == 0);
    INFO("rank " << r);
    CHECK(nested(mine[static_cast<std::size_t>(r)]));
    CHECK(mine[static_cast<std::size_t>(r)].size() > 20);
  }
  const std::string merged = text_of(trace);
  fs::remove(trace);
  CHECK(count(merged, "\"name\":\"step\"") == 20);
  CHECK(count(merged, "\"args\":{\"name\":\"rank 0\"}") == 1);
  CHECK(count(merged, "\"args\":{\"name\":\"rank 1\"}") == 1);
}

TEST_CASE("Each bucket's collective is on its own track, with bytes, bandwidth, arrival and a flow", "[monitor][timeline]") {
  using net = example::mlp;
  using policy = loom::data_parallel<loom::local_comm>;
  using trainer_t = loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy>;
  constexpr std::size_t buckets = loom::bucket_plan<net, float, policy::bucket_cap_bytes>::count;
  const fs::path trace = temp_path("buckets.json");
  std::size_t steps = 0;
  loom::local_world(2).run([&](loom::local_comm& c) {
    trainer_t t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    loom::fit_options o = loom_test::one_epoch();
    o.trace = trace.string();
    steps = t.fit(small_set(), o).steps;
  });
  REQUIRE(steps == 10);
  const std::size_t collectives = steps * buckets;
  for (int r = 0; r < 2; ++r) {
    const fs::path own = trace.parent_path() / (trace.stem().string() + ".rank" + std::to_string(r) + ".json");
    const std::string json = text_of(own);
    fs::remove(own);
    INFO("rank " << r);
    CHECK(count(json, "\"name\":\"allreduce bucket ") == collectives);
    CHECK(count(json, "\"cat\":\"bucket\",\"ph\":\"s\"") == collectives);
    CHECK(count(json, "\"cat\":\"bucket\",\"ph\":\"f\",\"bp\":\"e\"") == collectives);
    CHECK(count(json, "\"busbw_GBps\":") == collectives);
    CHECK(count(json, "\"name\":\"bus_GBps\",\"ph\":\"C\"") == collectives);
    CHECK(count(json, "\"late_ms\"") == 0);  // one rank alone has no arrivals to compare
    for (std::size_t b = 0; b < buckets; ++b)
      CHECK(count(json, "\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(r) + ",\"tid\":" +
                            std::to_string(b + 1'000'000) + ",\"args\":{\"name\":\"bucket " + std::to_string(b) + "\"}") == 1);
    // The passes: a forward, a backward (each layer's inside it) and an optimizer span a step.
    CHECK(count(json, "\"name\":\"forward\"") == steps);
    CHECK(count(json, "\"name\":\"backward\"") == steps);
    CHECK(count(json, "\"name\":\"backward layer ") == steps * net::layer_count);
    CHECK(count(json, "\"name\":\"optimizer\"") == steps);
  }
  const std::string merged = text_of(trace);
  fs::remove(trace);
  CHECK(count(merged, "\"name\":\"allreduce bucket ") == 2 * collectives);
  CHECK(count(merged, "\"late_ms\":") == 2 * collectives);  // each rank's arrival at each collective
  CHECK(count(merged, "\"late_ms\":0.000000") >= collectives);  // the first to arrive at each is 0 late
  // Every flow's id is unique in the merged file: ids 1..2 x collectives, each begun and ended once.
  for (std::size_t id : {std::size_t{1}, 2 * collectives}) {
    CHECK(count(merged, "\"ph\":\"s\",\"id\":" + std::to_string(id) + ",") == 1);
    CHECK(count(merged, "\"ph\":\"f\",\"bp\":\"e\",\"id\":" + std::to_string(id) + ",") == 1);
  }
  CHECK(count(merged, "\"id\":" + std::to_string(2 * collectives + 1) + ",") == 0);
}

TEST_CASE("Bucket payloads and bus bandwidth in the trace follow the plan", "[monitor][timeline]") {
  // A hand-made collective: 8 MB in 2 ms over 4 ranks, posted 1 ms after the other rank's.
  using loom::monitor::span_kind;
  const auto k = static_cast<std::uint32_t>(span_kind::collective);
  std::vector<std::vector<span_event>> ranks(2);
  ranks[0].push_back({0, 5'000'000, loom::monitor::step_span, 3, -1, -1, 0});
  ranks[0].push_back({1'000'000, 2'000'000, k, 3, 0, 4, 8e6});
  ranks[1].push_back({0, 5'000'000, loom::monitor::step_span, 3, -1, -1, 0});
  ranks[1].push_back({2'000'000, 1'000'000, k, 3, 0, 4, 8e6});
  const std::string json = loom::monitor::chrome_trace(ranks, {0, 0});
  CHECK_THAT(json, Catch::Contains("\"args\":{\"step\":3,\"bucket\":0,\"ranks\":4,\"bytes\":8000000,\"algbw_GBps\":4,"
                                   "\"busbw_GBps\":6,\"late_ms\":0.000000}"));
  CHECK_THAT(json, Catch::Contains("\"args\":{\"step\":3,\"bucket\":0,\"ranks\":4,\"bytes\":8000000,\"algbw_GBps\":8,"
                                   "\"busbw_GBps\":12,\"late_ms\":1.000000}"));
  // A counter and a pipeline send.
  std::vector<span_event> one{{7000, 0, static_cast<std::uint32_t>(span_kind::counter), 0,
                               static_cast<std::int32_t>(loom::monitor::counter::rss_bytes), -1, 123456789},
                              {9000, 500, static_cast<std::uint32_t>(span_kind::send), 2, 1, 3, 4096}};
  const std::string j1 = loom::monitor::chrome_trace({one}, {0});
  CHECK_THAT(j1, Catch::Contains("{\"name\":\"rss_bytes\",\"ph\":\"C\",\"pid\":0,\"tid\":0,\"ts\":7.000,\"args\":{\"value\":123456789}}"));
  CHECK_THAT(j1, Catch::Contains("\"name\":\"send\",\"cat\":\"loom\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":9.000,\"dur\":0.500,"
                                 "\"args\":{\"step\":2,\"micro_batch\":1,\"stage\":3,\"bytes\":4096}"));
}
