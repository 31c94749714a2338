// SPDX-License-Identifier: Apache-2.0
// Tests of the shard loader's arithmetic (loom/data/shard_schedule.hpp): the dealing of shards
// into streams, the split of each batch over the streams, the window shuffle, and the reader
// of one stream.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "loom/data/shard_schedule.hpp"
#include "shard_files.hpp"
#include "test_files.hpp"

namespace {

using loom::data::detail::batch_split;
using loom::data::detail::deal_shards;
using loom::data::detail::shard_schedule;
using loom::data::detail::stream_tie_order;

std::vector<std::uint64_t> uneven_counts() {
  return {100, 37, 64, 5, 100, 81, 12, 100, 99, 1, 50, 64, 100, 33};
}

}  // namespace

TEST_CASE("Streams win ties in bit-reversal order", "[data][shard_schedule]") {
  CHECK(stream_tie_order(16) == std::vector<std::size_t>{0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15});
  CHECK(stream_tie_order(6) == std::vector<std::size_t>{0, 4, 2, 1, 5, 3});
  CHECK(stream_tie_order(1) == std::vector<std::size_t>{0});
}

TEST_CASE("Dealing puts every shard in one stream, streams within one shard of each other", "[data][shard_schedule]") {
  const auto counts = uneven_counts();
  const std::uint64_t largest = *std::max_element(counts.begin(), counts.end());
  for (std::size_t streams : {1, 3, 4, 7, 14}) {
    for (std::uint64_t epoch : {0, 1, 2}) {
      const auto l = deal_shards(counts, streams, 42, epoch, true);
      std::multiset<std::uint32_t> all;
      for (std::size_t v = 0; v < streams; ++v) {
        all.insert(l.shards[v].begin(), l.shards[v].end());
        std::uint64_t n = 0;
        for (std::size_t j = 0; j < l.shards[v].size(); ++j) {
          CHECK(l.starts[v][j] == n);
          n += counts[l.shards[v][j]];
        }
        CHECK(l.samples[v] == n);
        CHECK(l.starts[v].back() == n);
      }
      CHECK(all.size() == counts.size());
      CHECK(std::set<std::uint32_t>(all.begin(), all.end()).size() == counts.size());
      const auto [lo, hi] = std::minmax_element(l.samples.begin(), l.samples.end());
      CHECK(*hi - *lo <= largest);
    }
  }
  // The same on every call; another epoch or seed deals another way.
  CHECK(deal_shards(counts, 4, 42, 1, true).shards == deal_shards(counts, 4, 42, 1, true).shards);
  CHECK(deal_shards(counts, 4, 42, 1, true).shards != deal_shards(counts, 4, 42, 2, true).shards);
  CHECK(deal_shards(counts, 4, 42, 1, true).shards != deal_shards(counts, 4, 43, 1, true).shards);
  // Without shuffle, in the set's order.
  const auto plain = deal_shards(std::vector<std::uint64_t>(8, 10), 4, 42, 5, false);
  CHECK(plain.shards == std::vector<std::vector<std::uint32_t>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}});
  // Ten equal shards over four streams: the two extra shards go to streams 0 and 2, one per
  // half, so that two ranks get five shards each.
  const auto ten = deal_shards(std::vector<std::uint64_t>(10, 10), 4, 42, 0, true);
  CHECK(ten.samples == std::vector<std::uint64_t>{30, 20, 30, 20});
}

TEST_CASE("Each batch takes B samples, from each stream in proportion, and all streams end together",
          "[data][shard_schedule]") {
  const std::vector<std::uint64_t> n{400, 300, 400, 300, 7, 0, 1000};
  const std::uint64_t total = std::accumulate(n.begin(), n.end(), std::uint64_t{0});
  for (std::uint64_t batch : {1, 5, 64, 500, 5000}) {
    batch_split s;
    s.reset(n);
    std::vector<std::uint64_t> prev(n.size(), 0);
    const std::uint64_t steps = (total + batch - 1) / batch;
    for (std::uint64_t k = 0; k < steps; ++k) {
      s.advance_to((k + 1) * batch);
      std::uint64_t took = 0;
      for (std::size_t v = 0; v < n.size(); ++v) {
        const std::uint64_t c = s.taken()[v] - prev[v];
        took += c;
        // Sainte-Laguë stays within one (here: two, to allow for rounding both ends) of the quota.
        const double quota = static_cast<double>(batch) * static_cast<double>(n[v]) / static_cast<double>(total);
        if (k + 1 < steps) CHECK(std::abs(static_cast<double>(c) - quota) <= 2.0);
        CHECK(s.taken()[v] <= n[v]);
        prev[v] = s.taken()[v];
      }
      CHECK(took == std::min(batch, total - k * batch));
    }
    CHECK(prev == n);
  }
}

TEST_CASE("The schedule visits every sample of an epoch once, windows permuted, steps addressable",
          "[data][shard_schedule]") {
  const auto counts = uneven_counts();
  const std::uint64_t total = std::accumulate(counts.begin(), counts.end(), std::uint64_t{0});
  for (const bool shuffle : {true, false}) {
    shard_schedule s(counts, 5, 16, 40, 7, shuffle);
    CHECK(s.steps_per_epoch() == (total + 39) / 40);
    for (std::size_t epoch : {0, 3}) {
      s.set_epoch(epoch);
      std::vector<int> seen(total, 0);
      std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges, again;
      std::vector<std::uint64_t> order;
      for (std::size_t k = 0; k < s.steps_per_epoch(); ++k) {
        s.step_ranges(k, ranges);
        for (std::size_t v = 0; v < 5; ++v)
          for (std::uint64_t p = ranges[v].first; p < ranges[v].second; ++p) {
            const std::uint64_t q = s.sample_at(v, p);
            CHECK(q / 16 == p / 16);  // within its window
            const auto at = s.locate(v, q);
            REQUIRE(at.member < counts[at.shard]);
            const std::uint64_t index = s.first_index(at.shard) + at.member;
            ++seen[index];
            order.push_back(index);
          }
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      // Without shuffle each stream reads its shards in order: positions are samples.
      if (!shuffle) CHECK(s.sample_at(2, 17) == 17);
      // Random access: step 7 alone gives what it gave in sequence.
      s.step_ranges(7, ranges);
      s.step_ranges(2, again);
      s.step_ranges(7, again);
      CHECK(again == ranges);
    }
  }
}

TEST_CASE("A stream reader hands out its samples, forward or after a jump back", "[data][shard_schedule]") {
  loom_test::temp_dir dir;
  const auto shards = loom_test::write_index_shards(dir.path(), "t", {6, 9, 4});
  const auto m = loom::data::load_manifest(shards);
  shard_schedule s({6, 9, 4}, 1, 5, 4, 3, true);
  s.set_epoch(0);
  loom::data::detail::stream_reader r(m, 10, 4096);
  for (const std::uint64_t q : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{7}, std::uint64_t{18},
                                std::uint64_t{2}}) {
    r.forget_window();
    const auto f = r.take(s, 0, q, true);
    const auto at = s.locate(0, q);
    const std::uint64_t index = s.first_index(at.shard) + at.member;
    INFO("stream sample " << q);
    CHECK(f.problem.empty());
    CHECK(f.index == index);
    CHECK(f.label == loom_test::test_label(index));
    CHECK(f.image == loom_test::png_gray(8, 8, loom_test::index_pixels(8, 8, index)));
  }
  CHECK(r.bytes_read() > 0);
  // A shard cut short: its samples after the cut come with the sentence, the others are fine.
  auto b = loom_test::file_bytes(shards[1]);
  b.resize(512 * 9);
  loom_test::write_file(shards[1], b);
  r.reset();
  std::size_t bad = 0;
  for (std::uint64_t q = 0; q < 19; ++q) {
    const auto f = r.take(s, 0, q, false);
    const auto at = s.locate(0, q);
    if (at.shard == 1 && !f.problem.empty()) {
      ++bad;
      CHECK(f.kind == loom::data::sample_problem::damaged_shard);
      CHECK_THAT(f.problem, Catch::Matchers::Contains("loom: shard " + shards[1].string()));
    } else {
      CHECK(f.problem.empty());
      CHECK(f.label == loom_test::test_label(s.first_index(at.shard) + at.member));
    }
  }
  CHECK(bad >= 6);
}
