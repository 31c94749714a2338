// SPDX-License-Identifier: Apache-2.0
// Live metrics (loom/monitor/metrics.hpp): the process sampler, per-rank file names, the
// Prometheus textfile and the JSON lines written during fit — their counts, values and
// atomic replacement — and the failures that must be loud (an unwritable path).

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"
#include "monitor_common.hpp"

namespace {

namespace fs = std::filesystem;
using loom_test::small_set;
using loom_test::temp_dir;
using loom_test::text_of;

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// The number after "key": in a JSON line of numbers.
double field(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  REQUIRE(at != std::string::npos);
  return std::stod(line.substr(at + key.size() + 3));
}

/// The value of a sample line `name{rank="r"} v` in a Prometheus exposition.
double sample(const std::string& text, const std::string& name, int rank) {
  const std::string key = name + "{rank=\"" + std::to_string(rank) + "\"} ";
  const auto at = text.find(key);
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + key.size()));
}

loom::metrics_options metrics(std::string prometheus, std::string jsonl, double every_s) {
  loom::metrics_options m;
  m.prometheus_file = std::move(prometheus);
  m.jsonl_file = std::move(jsonl);
  m.every_s = every_s;
  return m;
}

}  // namespace

TEST_CASE("The process sampler reads resident, peak and CPU figures", "[monitor][metrics]") {
  const auto a = loom::monitor::sample_process();
  std::vector<char> touch(64 << 20, 1);  // 64 MiB made resident
  const auto b = loom::monitor::sample_process();
  CHECK(a.rss_bytes > 1e6);
  CHECK(b.rss_bytes >= a.rss_bytes + 32e6);  // most of the 64 MiB shows up
  CHECK(b.peak_rss_bytes >= b.rss_bytes * 0.99);
  CHECK(b.cpu_s > 0);
  CHECK(touch[12345] == 1);
}

TEST_CASE("Several ranks' metrics files get .rank<r> before the extension", "[monitor][metrics]") {
  using loom::monitor::rank_path;
  CHECK(rank_path("out/metrics.prom", 0, 1) == "out/metrics.prom");
  CHECK(rank_path("out/metrics.prom", 3, 4) == "out/metrics.rank3.prom");
  CHECK(rank_path("out.d/metrics", 1, 2) == "out.d/metrics.rank1");
  CHECK(rank_path(".hidden", 1, 2) == ".hidden.rank1");
}

TEST_CASE("fit writes a JSON line per step and the Prometheus file holds the last state", "[monitor][metrics]") {
  temp_dir d;
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                        {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.metrics = metrics((d.path / "m.prom").string(), (d.path / "m.jsonl").string(), 0);
  const auto r = t.fit(small_set(), o);
  REQUIRE(r.steps == 10);
  const auto lines = lines_of(d.path / "m.jsonl");
  REQUIRE(lines.size() == 11);  // one per step, and the final state
  for (std::size_t i = 0; i < 10; ++i) {
    INFO(lines[i]);
    CHECK(field(lines[i], "step") == double(i + 1));
    CHECK(field(lines[i], "rank") == 0);
    CHECK(field(lines[i], "lr") == Approx(0.02));
    CHECK(field(lines[i], "samples") == double(64 * (i + 1)));
    CHECK(field(lines[i], "rss_bytes") > 1e6);
  }
  CHECK(field(lines[10], "step") == 10);
  CHECK(field(lines[10], "seconds") == Approx(r.seconds));
  CHECK(field(lines[10], "loss") == Approx(r.train_loss));
  const std::string prom = text_of(d.path / "m.prom");
  CHECK(sample(prom, "loom_steps_total", 0) == 10);
  CHECK(sample(prom, "loom_samples_total", 0) == 640);
  CHECK(sample(prom, "loom_train_loss", 0) == Approx(r.train_loss));
  CHECK(sample(prom, "loom_compute_seconds_total", 0) > 0);
  CHECK_THAT(prom, Catch::Contains("# TYPE loom_compute_seconds_total counter"));
  // Replaced atomically: no temporary file is left beside it.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(d.path)) files += e.is_regular_file();
  CHECK(files == 2);
}

TEST_CASE("With every_s large, only the final state is written", "[monitor][metrics]") {
  temp_dir d;
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.metrics = metrics("", (d.path / "m.jsonl").string(), 3600);
  t.fit(small_set(), o);
  const auto lines = lines_of(d.path / "m.jsonl");
  REQUIRE(lines.size() == 2);  // the first step (nothing written before it) and the end
  CHECK(field(lines[0], "step") == 1);
  CHECK(field(lines[1], "step") == 10);
}

TEST_CASE("Each rank writes its own files, without waiting for the others", "[monitor][metrics]") {
  temp_dir d;
  const std::string prom = (d.path / "m.prom").string();
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
        c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    loom::fit_options o = loom_test::one_epoch();
    o.metrics = metrics(prom, "", 0);
    t.fit(small_set(), o);
  });
  for (int r = 0; r < 2; ++r) {
    const std::string text = text_of(d.path / ("m.rank" + std::to_string(r) + ".prom"));
    CHECK(sample(text, "loom_steps_total", r) == 10);
    CHECK(sample(text, "loom_samples_total", r) == 320);  // half of each batch
    CHECK(sample(text, "loom_sent_bytes_total", r) > 0);
  }
  CHECK_FALSE(fs::exists(d.path / "m.prom"));
}

TEST_CASE("A metrics file in a folder that does not exist yet is written there, the folders created",
          "[monitor][metrics]") {
  temp_dir d;
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.max_steps = 2;
  o.metrics = metrics((d.path / "a" / "b" / "m.prom").string(), (d.path / "c" / "m.jsonl").string(), 0);
  t.fit(small_set(), o);
  const auto lines = lines_of(d.path / "c" / "m.jsonl");
  REQUIRE(lines.size() == 3);  // each step (every_s 0) and the end of fit
  CHECK(field(lines[2], "step") == 2);
  CHECK(sample(text_of(d.path / "a" / "b" / "m.prom"), "loom_steps_total", 0) == 2);
}

TEST_CASE("A metrics file that cannot be written stops fit with the path", "[monitor][metrics]") {
  temp_dir d;
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.max_steps = 1;
  // A regular file where a folder must be: no folder can be made there, not even by root.
  std::ofstream(d.path / "not-a-folder") << "x";
  const std::string bad = (d.path / "not-a-folder").string();
  o.metrics = metrics("", bad + "/m.jsonl", 0);
  CHECK_THROWS_WITH(t.fit(small_set(), o), Catch::Contains(bad + "/m.jsonl"));
  o.metrics = metrics(bad + "/m.prom", "", 0);
  CHECK_THROWS_WITH(t.fit(small_set(), o), Catch::Contains(bad + "/m.prom"));
  o.metrics = metrics("", "x.jsonl", -1);
  CHECK_THROWS_AS(t.fit(small_set(), o), loom::invalid_argument);
}
