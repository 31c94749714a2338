// SPDX-License-Identifier: Apache-2.0
// The live view and straggler naming (loom/monitor/live.hpp, loom/monitor/figures.hpp): the
// score and its threshold, the cause, peers within a pipeline stage, the step recorder's
// medians, the min / median / max folding past 16 ranks (20 fake ranks), the diagnosis
// sentence, and a 2-rank fit whose ranks exchange at the same steps and draw on rank 0. The
// straggler under a real CPU hog is monitor.straggler.np2 (straggler_check.sh).

#include <catch2/catch.hpp>

#include <atomic>
#include <sstream>
#include <string>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"
#include "monitor_common.hpp"

namespace {

/// A rank of a 10-second window whose steps take compute_ms + data_ms of its own work.
loom::rank_figures rank_with(double compute_ms, double data_ms, double stage = 0) {
  loom::rank_figures f;
  f.step_compute_s = compute_ms / 1e3;
  f.step_data_s = data_ms / 1e3;
  f.step_s = f.step_compute_s + f.step_data_s;
  f.seconds = 10;
  f.compute_s = 5;
  f.data_s = 1;
  f.samples = 6400;
  f.stage = stage;
  return f;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

const loom::data::fashion_mnist_set& small_set() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(1280);
  return s;
}

}  // namespace

TEST_CASE("The straggler is the rank scored below 0.75: the fastest peer's median over its own",
          "[monitor][live][straggler]") {
  // Rank 2's compute per step is twice the others'.
  std::vector<loom::rank_figures> ranks{rank_with(3, 1), rank_with(3.2, 1), rank_with(7, 1), rank_with(3.1, 1.1)};
  const auto score = loom::straggler_scores(ranks);
  CHECK(score[0] == Approx(1.0));
  CHECK(score[2] == Approx(4.0 / 8.0));
  CHECK(score[1] == Approx(4.0 / 4.2));
  const loom::straggler s = loom::find_straggler(ranks);
  REQUIRE(s);
  CHECK(s.rank == 2);
  CHECK(s.fastest == 0);
  CHECK(s.why == loom::straggler::cause::compute);
  CHECK(s.others == 0);
  const std::string line = loom::describe(s, ranks);
  CHECK_THAT(line, Catch::StartsWith("straggler: rank 2 (score 0.50 against rank 0): its compute, 7.00 ms a step"));
}

TEST_CASE("A straggler whose data per step exceeds the fastest rank's more than its compute is named for its data",
          "[monitor][live][straggler]") {
  std::vector<loom::rank_figures> ranks{rank_with(3, 1), rank_with(3.5, 4)};
  const loom::straggler s = loom::find_straggler(ranks);
  REQUIRE(s);
  CHECK(s.rank == 1);
  CHECK(s.why == loom::straggler::cause::data);
  CHECK_THAT(loom::describe(s, ranks), Catch::Contains("its data, 4.00 ms a step against 1.00 ms"));
}

TEST_CASE("A score of exactly 0.75 is no straggler, and just below it is", "[monitor][live][straggler]") {
  std::vector<loom::rank_figures> ranks(2);
  ranks[0].step_s = ranks[0].step_compute_s = 0.375;  // binary fractions: the score is exactly 0.75
  ranks[1].step_s = ranks[1].step_compute_s = 0.5;
  CHECK(loom::straggler_scores(ranks)[1] == 0.75);
  CHECK_FALSE(loom::find_straggler(ranks));
  ranks[1].step_s = ranks[1].step_compute_s = 0.50390625;  // 0.375 / 0.50390625 = 0.744...
  CHECK(loom::find_straggler(ranks).rank == 1);
}

TEST_CASE("Of several ranks below the threshold the lowest score is named and the others counted",
          "[monitor][live][straggler]") {
  std::vector<loom::rank_figures> ranks{rank_with(2, 0), rank_with(5, 0), rank_with(9, 0), rank_with(2.1, 0)};
  const loom::straggler s = loom::find_straggler(ranks);
  CHECK(s.rank == 2);
  CHECK(s.others == 1);
  CHECK_THAT(loom::describe(s, ranks), Catch::EndsWith("(1 more rank(s) below 0.75)"));
}

TEST_CASE("Pipeline ranks are scored against the ranks of their own stage only", "[monitor][live][straggler]") {
  // Stage 1 does three times stage 0's work by design: no straggler. A slow replica of stage 1 is.
  std::vector<loom::rank_figures> ranks{rank_with(2, 1, 0), rank_with(9, 0, 1), rank_with(2.1, 1, 0), rank_with(9.5, 0, 1)};
  CHECK_FALSE(loom::find_straggler(ranks));
  ranks[3] = rank_with(14, 0, 1);
  const loom::straggler s = loom::find_straggler(ranks);
  CHECK(s.rank == 3);
  CHECK(s.fastest == 1);
}

TEST_CASE("Ranks that measured no step are neither stragglers nor the fastest", "[monitor][live][straggler]") {
  std::vector<loom::rank_figures> ranks{rank_with(0, 0), rank_with(3, 0), rank_with(3.1, 0)};
  CHECK(loom::straggler_scores(ranks)[0] == 1.0);
  CHECK_FALSE(loom::find_straggler(ranks));
}

TEST_CASE("The step recorder keeps each step's compute and data and takes medians of the last k",
          "[monitor][live]") {
  loom::rank_figures fig;
  loom::monitor::step_recorder rec(fig);
  const double compute[] = {0.5, 0.001, 0.002, 0.003, 0.004};  // a slow first step, then 1..4 ms
  for (double c : compute) {
    fig.compute_s += c;
    fig.data_s += 0.001;
    rec.record();
  }
  loom::rank_figures m;
  rec.medians(5, m);
  CHECK(m.step_compute_s == Approx(0.003));  // the first step's outlier does not move it
  CHECK(m.step_data_s == Approx(0.001));
  CHECK(m.step_s == Approx(0.004));
  rec.medians(2, m);  // the last two steps: 3 and 4 ms, lower median 3
  CHECK(m.step_compute_s == Approx(0.003));
  rec.medians(3, m);
  CHECK(m.step_compute_s == Approx(0.003));
  rec.medians(1, m);
  CHECK(m.step_compute_s == Approx(0.004));
}

TEST_CASE("Folding a column gives its min, median and max and which rank has each", "[monitor][live]") {
  std::vector<double> v(20);
  for (int r = 0; r < 20; ++r) v[static_cast<std::size_t>(r)] = 100 + ((r * 7) % 20);  // a permutation of 100..119
  const auto f = loom::monitor::fold_column(v);
  CHECK(f.min == 100);
  CHECK(f.min_rank == 0);
  CHECK(f.max == 119);
  CHECK(f.max_rank == 17);  // 17 * 7 = 119
  CHECK(f.median == 109);   // lower median of 20
  CHECK((f.median_rank * 7) % 20 == 9);
  // Ties: the lowest rank.
  const auto t = loom::monitor::fold_column({5, 1, 5, 1});
  CHECK(t.min_rank == 1);
  CHECK(t.max_rank == 0);
}

TEST_CASE("Past 16 ranks the live view folds the rows into min, median and max naming the ranks", "[monitor][live]") {
  std::vector<loom::rank_figures> ranks;
  for (int r = 0; r < 20; ++r) ranks.push_back(rank_with(3 + 0.01 * r, 1));
  ranks[13] = rank_with(8, 1);  // the straggler
  ranks[13].resident_bytes = 900e6;  // and the most memory
  const std::string table = loom::monitor::live_table(ranks);
  INFO(table);
  CHECK(count(table, "\n") == 5);  // header, min, median, max, straggler
  CHECK_THAT(table, Catch::StartsWith("20r"));
  CHECK(count(table, "\nmin ") == 1);
  CHECK(count(table, "\nmedian ") == 1);
  CHECK(count(table, "\nmax ") == 1);
  CHECK_THAT(table, Catch::Contains("900.0 r13"));   // RSS max
  CHECK_THAT(table, Catch::Contains("9.00 r13"));    // step_ms max
  CHECK_THAT(table, Catch::Contains("0.44 r13"));    // score min: 4 / 9
  CHECK_THAT(table, Catch::Contains("straggler: rank 13 (score 0.44 against rank 0): its compute"));
  // At 16 ranks: a row per rank.
  ranks.resize(16);
  const std::string rows = loom::monitor::live_table(ranks);
  CHECK(count(rows, "\n") == 18);  // header, 16 rows, the straggler
  CHECK_THAT(rows, Catch::StartsWith("rank"));
  CHECK_THAT(rows, Catch::Contains("\n  15 "));
}

TEST_CASE("The diagnosis names the straggler first, else the largest share of the step lost", "[monitor][live]") {
  std::vector<loom::rank_figures> ranks{rank_with(3, 1), rank_with(3, 1)};
  for (auto& f : ranks) f.compute_s = 5.5, f.comm_exposed_s = 4.1, f.data_s = 0.2;
  CHECK_THAT(loom::diagnosis(ranks), Catch::StartsWith("communication was exposed for 41% of the step: raise the batch"));
  for (auto& f : ranks) f.compute_s = 9.2, f.comm_exposed_s = 0.3, f.data_s = 0.2;
  CHECK_THAT(loom::diagnosis(ranks), Catch::StartsWith("compute took 92% of the step: the run is compute-bound"));
  for (auto& f : ranks) f.compute_s = 6, f.data_s = 3;
  CHECK_THAT(loom::diagnosis(ranks), Catch::StartsWith("reading and converting samples took 30% of the step"));
  CHECK_THAT(loom::diagnosis(ranks), Catch::Contains("--decode-threads"));  // the fix for starving image shards
  for (auto& f : ranks) f.data_s = 0.1, f.bubble_s = 3.5;
  CHECK_THAT(loom::diagnosis(ranks), Catch::StartsWith("the pipeline bubble took 35% of the step"));
  ranks[1] = rank_with(8, 1);
  ranks[0].comm_exposed_s = 4.5;
  CHECK_THAT(loom::diagnosis(ranks), Catch::StartsWith("rank 1 held the others back: its compute took 2.7x rank 0's per "
                                                       "step, and rank 0 was blocked on its peers 80% of its time"));
  // The end-of-run table names the straggler and closes with the diagnosis.
  const std::string table = loom::figures_table(ranks);
  CHECK_THAT(table, Catch::Contains("\nstraggler: rank 1 (score 0.44 against rank 0)"));
  CHECK_THAT(table, Catch::EndsWith("bind ranks to cores\n"));
  CHECK(count(loom::stage_figures_table(ranks), "\ndiagnosis: rank 1 held the others back") == 1);
}

TEST_CASE("Two ranks exchange their figures at the same steps and rank 0 draws a row for each", "[monitor][live]") {
  std::ostringstream out;
  std::vector<loom::fit_result> results(2);
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
        c, {.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = 1}};
    loom::fit_options o = loom_test::one_epoch();  // 20 steps
    o.live_every_s = 1e-6;                           // the shortest interval: 1 step
    o.progress = c.rank() == 0 ? &out : nullptr;
    o.progress_style = loom::progress_mode::lines;
    results[static_cast<std::size_t>(c.rank())] = t.fit(small_set(), o);
  });
  for (const auto& r : results) {
    CHECK(r.steps == 20);
    REQUIRE(r.figures.size() == 2);
    // The whole fit's medians and each rank's memory reach the gathered figures.
    for (const auto& f : r.figures) {
      CHECK(f.step_compute_s > 0);
      CHECK(f.step_s >= f.step_compute_s);
      CHECK(f.resident_bytes > 1e6);
    }
  }
  const std::string text = out.str();
  INFO(text);
  // Exchanges at steps 10 (the first), then every step: 11 drawings, each of 2 rank rows.
  CHECK(count(text, "live: step ") == 11);
  CHECK(count(text, "live: step 10, ") == 1);
  CHECK(count(text, "live: step 20, ") == 1);
  CHECK(count(text, "exchange every 1 steps") == 11);
  CHECK(count(text, "\nlive:    0 ") == 11);
  CHECK(count(text, "\nlive:    1 ") == 11);
}

TEST_CASE("Ranks asking for different live intervals are refused before they exchange", "[monitor][live]") {
  std::atomic<int> refused{0};
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
        c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    loom::fit_options o = loom_test::one_epoch();
    o.live_every_s = c.rank() == 0 ? 2.0 : 3.0;
    try {
      t.fit(small_set(), o);
    } catch (const loom::communication_error& e) {
      if (std::string(e.what()).find("live_every_s") != std::string::npos) ++refused;  // names the field
    }
  });
  CHECK(refused == 2);
}

TEST_CASE("A negative live interval is refused", "[monitor][live]") {
  loom::rank_figures f;
  CHECK_THROWS_AS(loom::monitor::live_view(-1, f, nullptr, loom::progress_mode::lines), loom::invalid_argument);
  CHECK_NOTHROW(loom::monitor::live_view(0, f, nullptr, loom::progress_mode::lines));
}
