// SPDX-License-Identifier: Apache-2.0
// Tests of loom::data::distributed_loader, with every rank of a world simulated in one process:
// the ranks' shares of each global batch, in rank order, are exactly batch_loader's batch.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <numeric>
#include <set>
#include <type_traits>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/loader.hpp"
#include "loom/data/mapped.hpp"
#include "test_files.hpp"

namespace {

/// n samples of shape (2) whose pixels spell the index (low byte, high byte); label index % 256.
using index_set = loom::data::labelled_images<loom::shape<2>, 256>;

index_set make_index_set(std::size_t n) {
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint8_t> labels;
  for (std::size_t i = 0; i < n; ++i) {
    pixels.push_back(static_cast<std::uint8_t>(i));
    pixels.push_back(static_cast<std::uint8_t>(i >> 8));
    labels.push_back(static_cast<std::uint8_t>(i));
  }
  return index_set(pixels, labels, "index set");
}

std::size_t index_of(const float* x) {
  return static_cast<std::size_t>(x[0] * 255.0f + 0.5f) +
         256 * static_cast<std::size_t>(x[1] * 255.0f + 0.5f);
}

/// One batch as a loader writes it.
struct batch {
  std::vector<float> x;
  std::vector<std::int32_t> labels;
  bool operator==(const batch&) const = default;
};

/// Every batch of one epoch of batch_loader(set, b, seed, shuffle).
template <class Set>
std::vector<batch> reference_epoch(const Set& set, std::size_t b, std::uint64_t seed, bool shuffle,
                                   std::size_t epoch) {
  constexpr std::size_t sample = Set::sample_shape::size;
  loom::data::batch_loader<Set> loader(set, b, seed, shuffle);
  loader.start_epoch(epoch);
  std::vector<batch> out;
  std::vector<float> x(b * sample);
  std::vector<std::int32_t> labels(b);
  while (std::size_t n = loader.next(x.data(), labels.data())) {
    out.push_back({{x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n * sample)},
                   {labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(n)}});
  }
  return out;
}

/// Runs one epoch on every rank of a world in lock step and checks each step's shares against
/// the reference batch: concatenated in rank order they are that batch; offsets, sizes and the
/// end of the epoch agree on every rank. Returns the samples each rank saw.
template <class Set>
std::vector<std::vector<std::size_t>> check_epoch(const Set& set, std::size_t b, std::uint64_t seed,
                                                  bool shuffle, int world, std::size_t epoch) {
  constexpr std::size_t sample = Set::sample_shape::size;
  const std::vector<batch> ref = reference_epoch(set, b, seed, shuffle, epoch);
  std::vector<loom::data::distributed_loader<Set>> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(set, b, seed, r, world, shuffle);
  std::vector<std::vector<std::size_t>> seen(static_cast<std::size_t>(world));
  const std::size_t room = ranks[0].max_local_batch();
  CHECK(room == (b + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world));
  for (auto& l : ranks) {
    l.start_epoch(epoch);
    CHECK(l.batches_per_epoch() == ref.size());
  }
  for (std::size_t step = 0; step <= ref.size(); ++step) {
    batch joined;
    std::size_t min_local = SIZE_MAX, max_local = 0;
    for (int r = 0; r < world; ++r) {
      auto& l = ranks[static_cast<std::size_t>(r)];
      // Sentinels past the share: next() must not write beyond what it returns.
      std::vector<float> x(room * sample + sample, -1.0f);
      std::vector<std::int32_t> labels(room + 1, -1);
      const loom::data::batch_share share = l.next(x.data(), labels.data());
      INFO("world " << world << ", rank " << r << ", batch " << b << ", size " << set.size()
                    << ", step " << step);
      if (step == ref.size()) {  // the end of the epoch, the same on every rank
        CHECK_FALSE(share);
        CHECK(share == loom::data::batch_share{});
        CHECK(l.local_offset() == 0);
        continue;
      }
      REQUIRE(share);
      CHECK(share.global == ref[step].labels.size());
      CHECK(share.offset == joined.labels.size());  // shares are contiguous, in rank order
      CHECK(l.local_offset() == share.offset);
      REQUIRE(share.local <= room);
      CHECK(x[share.local * sample] == -1.0f);
      CHECK(labels[share.local] == -1);
      min_local = std::min(min_local, share.local);
      max_local = std::max(max_local, share.local);
      joined.x.insert(joined.x.end(), x.begin(),
                      x.begin() + static_cast<std::ptrdiff_t>(share.local * sample));
      joined.labels.insert(joined.labels.end(), labels.begin(),
                           labels.begin() + static_cast<std::ptrdiff_t>(share.local));
      for (std::size_t k = 0; k < share.local; ++k) {
        seen[static_cast<std::size_t>(r)].push_back(index_of(x.data() + k * sample));
      }
    }
    if (step < ref.size()) {
      CHECK(joined == ref[step]);  // pixels (bit for bit) and labels, in the same order
      CHECK(max_local - min_local <= 1);
    }
  }
  return seen;
}

}  // namespace

TEST_CASE("The ranks' shares of each global batch, in rank order, are batch_loader's batch",
          "[data][distributed]") {
  for (std::size_t n : {0, 1, 2, 3, 37, 100, 257}) {
    const auto set = make_index_set(n);
    for (std::size_t b : {1, 2, 3, 4, 5, 7, 8, 10, 25, 37, 64, 100, 300}) {
      for (int world : {1, 2, 3, 4}) {
        for (bool shuffle : {true, false}) {
          for (std::size_t epoch : {0, 1, 5}) (void)check_epoch(set, b, 42, shuffle, world, epoch);
        }
      }
    }
  }
}

TEST_CASE("Across ranks every sample is seen exactly once per epoch, and shares are disjoint",
          "[data][distributed]") {
  const auto set = make_index_set(1001);  // prime to every batch below: a short tail each time
  for (std::size_t b : {8, 64, 100, 1000, 2000}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (std::size_t epoch : {0, 1}) {
        const auto seen = check_epoch(set, b, 7, true, world, epoch);
        std::vector<std::size_t> all;
        std::vector<std::set<std::size_t>> per_rank;
        for (const auto& s : seen) {
          per_rank.emplace_back(s.begin(), s.end());
          CHECK(per_rank.back().size() == s.size());  // no repeat within a rank
          all.insert(all.end(), s.begin(), s.end());
        }
        for (std::size_t r = 0; r < per_rank.size(); ++r) {
          for (std::size_t q = r + 1; q < per_rank.size(); ++q) {
            std::vector<std::size_t> common;
            std::set_intersection(per_rank[r].begin(), per_rank[r].end(), per_rank[q].begin(),
                                  per_rank[q].end(), std::back_inserter(common));
            CHECK(common.empty());
          }
        }
        std::sort(all.begin(), all.end());
        std::vector<std::size_t> expected(set.size());
        std::iota(expected.begin(), expected.end(), std::size_t{0});
        CHECK(all == expected);
      }
    }
  }
}

TEST_CASE("A short tail gives some ranks an empty share, told apart from the end of the epoch",
          "[data][distributed]") {
  const auto set = make_index_set(5);
  // 5 samples, global batch 4, 4 ranks: step 0 gives each rank 1 sample; step 1 has 1 sample,
  // which goes to rank 3 (positions [1 * r / 4, 1 * (r + 1) / 4)); then the epoch ends.
  std::vector<float> x(2);
  std::vector<std::int32_t> labels(1);
  for (int r = 0; r < 4; ++r) {
    loom::data::distributed_loader<index_set> l(set, 4, 3, r, 4);
    CHECK(l.batches_per_epoch() == 2);
    CHECK(l.max_local_batch() == 1);
    CHECK(l.next(x.data(), labels.data()) ==
          loom::data::batch_share{1, 4, static_cast<std::size_t>(r)});
    const auto tail = l.next(x.data(), labels.data());
    CHECK(static_cast<bool>(tail));  // the epoch goes on even when this rank's share is empty
    CHECK(tail == loom::data::batch_share{r == 3 ? 1u : 0u, 1, 0});
    CHECK_FALSE(l.next(x.data(), labels.data()));
    CHECK_FALSE(l.next(x.data(), labels.data()));
    l.start_epoch(1);
    CHECK(l.epoch() == 1);
    CHECK(l.next(x.data(), labels.data()).global == 4);

    // The unpacked form: the local count, and the global size through the out parameter.
    l.start_epoch(0);
    std::size_t global_n = 99;
    CHECK(l.next(x.data(), labels.data(), global_n) == 1);
    CHECK(global_n == 4);
    CHECK(l.local_offset() == static_cast<std::size_t>(r));
    CHECK(l.next(x.data(), labels.data(), global_n) == (r == 3 ? 1u : 0u));
    CHECK(global_n == 1);  // an empty share, not the end
    CHECK(l.next(x.data(), labels.data(), global_n) == 0);
    CHECK(global_n == 0);  // the end of the epoch
  }
}

TEST_CASE("More ranks than samples in a global batch still step together", "[data][distributed]") {
  const auto set = make_index_set(10);
  (void)check_epoch(set, 3, 11, true, 4, 0);  // one rank idle every step
  (void)check_epoch(set, 1, 11, true, 3, 2);  // two ranks idle every step
}

TEST_CASE("The distributed loader writes doubles as batch_loader does", "[data][distributed]") {
  const auto set = make_index_set(9);
  loom::data::batch_loader<index_set> one(set, 9, 5);
  std::vector<double> ref(18);
  std::vector<std::int32_t> ref_labels(9);
  REQUIRE(one.next(ref.data(), ref_labels.data()) == 9);
  std::vector<double> joined;
  for (int r = 0; r < 2; ++r) {
    loom::data::distributed_loader<index_set> l(set, 9, 5, r, 2);
    std::vector<double> x(2 * l.max_local_batch());
    std::vector<std::int32_t> labels(l.max_local_batch());
    const auto share = l.next(x.data(), labels.data());
    joined.insert(joined.end(), x.begin(),
                  x.begin() + static_cast<std::ptrdiff_t>(2 * share.local));
  }
  CHECK(joined == ref);
}

TEST_CASE("Over a memory-mapped set the ranks' shares are batch_loader's batches",
          "[data][distributed]") {
  loom_test::temp_dir dir;
  const std::uint32_t n = 203;
  std::vector<std::uint8_t> labels(n);
  for (std::uint32_t i = 0; i < n; ++i) labels[i] = static_cast<std::uint8_t>(i * 7 % 10);
  const auto images = loom_test::write_raw(
      dir / "images", loom_test::idx_ubyte({n, 28, 28}, loom_test::some_bytes(n * 784)));
  const auto label_file = loom_test::write_gz(dir / "labels.gz", loom_test::idx_ubyte({n}, labels));
  const auto mapped = loom::data::mapped_fashion_mnist_set::from_idx(images, label_file);
  const auto in_memory = loom::data::fashion_mnist_set::from_idx(images, label_file);
  for (int world : {1, 3, 4}) {
    for (std::size_t b : {16, 64}) {
      const std::vector<batch> ref = reference_epoch(in_memory, b, 99, true, 1);
      std::vector<loom::data::distributed_loader<loom::data::mapped_fashion_mnist_set>> ranks;
      for (int r = 0; r < world; ++r) ranks.emplace_back(mapped, b, 99, r, world);
      for (auto& l : ranks) l.start_epoch(1);
      for (const batch& want : ref) {
        batch joined;
        for (auto& l : ranks) {
          std::vector<float> x(l.max_local_batch() * 784);
          std::vector<std::int32_t> lab(l.max_local_batch());
          const auto share = l.next(x.data(), lab.data());
          REQUIRE(share.global == want.labels.size());
          joined.x.insert(joined.x.end(), x.begin(),
                          x.begin() + static_cast<std::ptrdiff_t>(share.local * 784));
          joined.labels.insert(joined.labels.end(), lab.begin(),
                               lab.begin() + static_cast<std::ptrdiff_t>(share.local));
        }
        CHECK(joined == want);
      }
    }
  }
}

TEST_CASE("Bad world sizes, ranks and batch sizes are invalid arguments", "[data][distributed]") {
  using Catch::Matchers::Contains;
  using loader = loom::data::distributed_loader<index_set>;
  const auto set = make_index_set(4);
  CHECK_THROWS_AS(loader(set, 0, 1, 0, 1), loom::invalid_argument);
  CHECK_THROWS_WITH(loader(set, 0, 1, 0, 1), Contains("global batch size of at least 1, found 0"));
  CHECK_THROWS_WITH(loader(set, 4, 1, 0, 0), Contains("world size of at least 1, found 0"));
  CHECK_THROWS_WITH(loader(set, 4, 1, 2, 2),
                    Contains("expected a rank in 0..1 for a world of 2, found 2"));
  CHECK_THROWS_WITH(loader(set, 4, 1, -1, 2), Contains("found -1"));
  STATIC_REQUIRE(
      std::is_constructible_v<loader, const index_set&, std::size_t, std::uint64_t, int, int>);
  STATIC_REQUIRE_FALSE(
      std::is_constructible_v<loader, index_set&&, std::size_t, std::uint64_t, int, int>);
}
