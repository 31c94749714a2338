// SPDX-License-Identifier: Apache-2.0
// The machine sampler (loom/monitor/sampler.hpp): /proc/net/dev parsed, NVML loaded with dlopen
// (absent here: the fields stay empty and nothing fails; a stand-in library with NVML's
// functions: its values arrive in the sample, the metrics files and the timeline), rates over
// the interval, the measured GEMM ceiling, and the figures' FLOPs, bus bandwidth and overlap a
// fit fills in.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"
#include "monitor_common.hpp"

namespace {

using loom_test::small_set;
using loom_test::temp_dir;
using loom_test::text_of;

/// Sets an environment variable for a scope, restoring what was there.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~scoped_env() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("/proc/net/dev is summed over the interfaces but loopback", "[monitor][sampler]") {
  const std::string text =
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
      "    lo: 9000000     100    0    0    0     0          0         0  9000000     100    0    0    0     0       0          0\n"
      "  eth0:    1500      10    0    0    0     0          0         0     2500      20    0    0    0     0       0          0\n"
      "veth-a:     100       1    0    0    0     0          0         0      300       3    0    0    0     0       0          0\n";
  const auto s = loom::monitor::parse_net_dev(text);
  REQUIRE(s);
  CHECK(s->received_bytes == 1600);
  CHECK(s->sent_bytes == 2800);
  CHECK_FALSE(loom::monitor::parse_net_dev("garbage\nmore garbage\n"));
  CHECK(loom::monitor::sample_network());  // this machine's own file parses
}

TEST_CASE("Without NVML the device fields stay empty and nothing fails", "[monitor][sampler]") {
  scoped_env env("LOOM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
  const loom::monitor::nvml n;
  CHECK_FALSE(n.available());
  CHECK_THAT(n.why_not(), Catch::Contains("NVML not loaded") && Catch::Contains("/nonexistent/libnvidia-ml.so.1"));
  CHECK_FALSE(n.sample());
  loom::rank_figures f;
  loom::monitor::sampler s(f, nullptr, 0);
  CHECK_FALSE(s.sample_now().device);
}

TEST_CASE("NVML's functions loaded with dlopen give the device's memory and utilisation", "[monitor][sampler]") {
  scoped_env env("LOOM_NVML_LIBRARY", LOOM_FAKE_NVML);
  const auto n = std::make_shared<const loom::monitor::nvml>("0000:3b:00.0");
  REQUIRE(n->available());
  CHECK(n->why_not().empty());
  const auto d = n->sample();
  REQUIRE(d);
  CHECK(d->memory_used_bytes == double(1ull << 30));
  CHECK(d->memory_total_bytes == double(80ull << 30));
  CHECK(d->utilization_percent == 42);
  CHECK_FALSE(loom::monitor::nvml("0000:99:00.0").available());  // another bus id: not this device
  CHECK_THAT(loom::monitor::nvml("0000:99:00.0").why_not(), Catch::Contains("no NVML device 0000:99:00.0"));
  CHECK(loom::monitor::nvml("", 0).available());

  // The sample reaches the timeline as counters and the metrics files as their fields.
  loom::rank_figures f;
  loom::monitor::timeline t;
  loom::monitor::timeline_scope rec(&t);
  loom::monitor::sampler s(f, n, 0);
  const auto& m = s.sample_now();
  REQUIRE(m.device);
  CHECK(m.device->utilization_percent == 42);
  const std::string json = loom::monitor::chrome_trace({t.events()}, {t.dropped()});
  CHECK(count(json, "\"name\":\"gpu_memory_bytes\",\"ph\":\"C\"") == 1);
  CHECK(count(json, "\"name\":\"gpu_utilization_percent\",\"ph\":\"C\"") == 1);
  CHECK_THAT(json, Catch::Contains("\"args\":{\"value\":42}"));

  temp_dir scratch;
  const auto& dir = scratch.path;
  loom::metrics_options o;
  o.prometheus_file = (dir / "m.prom").string();
  o.jsonl_file = (dir / "m.jsonl").string();
  loom::monitor::metrics_writer w(o, 0, 1);
  w.tick(f, {}, m, true);
  const std::string prom = text_of(dir / "m.prom");
  CHECK_THAT(prom, Catch::Contains("loom_gpu_memory_used_bytes{rank=\"0\"} 1073741824\n"));
  CHECK_THAT(prom, Catch::Contains("loom_gpu_utilization_ratio{rank=\"0\"} 0.41999999999999998\n"));
  CHECK_THAT(text_of(dir / "m.jsonl"), Catch::Contains("\"gpu_utilization_percent\":42"));
}

TEST_CASE("The sampler's rates are over the interval since its last sample", "[monitor][sampler]") {
  loom::rank_figures f;
  const auto t0 = loom::monitor::clock::now();
  const double cpu0 = loom::monitor::sample_process().cpu_s;
  loom::monitor::sampler s(f, nullptr, 3600);
  const std::size_t first = s.samples();
  s.tick();
  CHECK(s.samples() == first);  // an hour has not passed
  // Busy until this process has used 0.2 s of CPU (however long that takes on a loaded
  // machine): the sample's CPU share is at least that over the wall time around the sampler's
  // interval, and at most one core's (one thread).
  volatile double x = 0;
  while (loom::monitor::sample_process().cpu_s - cpu0 < 0.2)
    for (int i = 0; i < 100000; ++i) x = x + 1;
  f.compute_s = 2;
  f.flops = 6e9;
  const auto& m = s.sample_now();
  const double wall = loom::monitor::seconds_between(t0, loom::monitor::clock::now());
  INFO("CPU " << m.cpu_percent << "% over an interval within " << wall << " s");
  CHECK(m.cpu_percent >= 0.95 * 100 * 0.2 / wall);
  CHECK(m.cpu_percent <= 110);
  CHECK(m.gflops == Approx(3.0));  // 6e9 FLOPs in 2 s of compute
  CHECK(m.process.rss_bytes > 1e6);
}

TEST_CASE("The GEMM ceiling is measured once and is a real rate", "[monitor][sampler]") {
  const double a = loom::monitor::measure_peak_gflops<loom::cpu>();
  CHECK(a > 0.5);   // any CPU of this century, one thread
  CHECK(a < 1e5);   // and no more than a rack of them
  CHECK(loom::monitor::measure_peak_gflops<loom::cpu>() == a);  // remembered
}

TEST_CASE("A fit counts its FLOPs from the layers' compile-time counts", "[monitor][sampler]") {
  using net = example::mlp;
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.live_every_s = 0;
  const auto r = t.fit(small_set(), o);
  REQUIRE(r.figures.size() == 1);
  const loom::rank_figures& f = r.figures[0];
  CHECK(f.flops == Approx(3.0 * net::flops_per_sample * f.samples));
  CHECK(f.achieved_gflops() > 0);
  CHECK(f.peak_gflops == 0);  // nothing showed it: not measured
  temp_dir d;
  o.trace = (d.path / "t.json").string();
  const auto r2 = t.fit(small_set(), o);
  CHECK(r2.figures[0].peak_gflops > 0);
  CHECK(r2.figures[0].peak_percent() > 0);
}

TEST_CASE("Bus bandwidth and overlap come from the gradient collectives' bytes and times", "[monitor][sampler]") {
  loom::rank_figures f;
  f.comm_s = 2;
  f.comm_exposed_s = 0.5;
  f.comm_bytes = 4e9;
  f.bus_bytes = 6e9;  // 4 ranks: 2 (n-1)/n = 1.5
  CHECK(f.algorithm_gbps() == Approx(2.0));
  CHECK(f.bus_gbps() == Approx(3.0));
  CHECK(f.overlap_percent() == Approx(75.0));
  f.comm_exposed_s = 3;  // exposed can exceed in-flight (waiting for a late peer): no negative overlap
  CHECK(f.overlap_percent() == 0);

  std::vector<loom::rank_figures> figures(2);
  std::size_t steps = 0;
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
        c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    const auto r = t.fit(small_set(), loom_test::one_epoch());
    figures[static_cast<std::size_t>(c.rank())] = r.figures[static_cast<std::size_t>(c.rank())];
    if (c.rank() == 0) steps = r.steps;
  });
  REQUIRE(steps > 0);
  for (const auto& g : figures) {
    // Every step allreduces every gradient once: payload = steps x parameters x 4 bytes.
    CHECK(g.comm_bytes == double(steps * example::mlp::parameter_count * sizeof(float)));
    CHECK(g.bus_bytes == Approx(g.comm_bytes));  // 2 ranks: 2 (n-1)/n = 1
    CHECK(g.bus_gbps() > 0);
    CHECK(g.overlap_percent() >= 0);
    CHECK(g.overlap_percent() <= 100);
  }
  CHECK(figures[0].comm_bytes == figures[1].comm_bytes);
}
