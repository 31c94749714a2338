// SPDX-License-Identifier: Apache-2.0
// Tests of image_shards and shard_loader in one process, the ranks of a world played by several
// loaders side by side (tests/data/shard_loader_mpi.cpp runs them as processes under mpirun):
// every sample once per epoch for any world size, the same global batches for every world
// size, skip and reshard mid-epoch, labels-only and share-only reads, bad samples (fail and
// skip), and a fuzz of 1,000 corrupted shards.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/data/shard_loader.hpp"
#include "shard_files.hpp"
#include "test_files.hpp"

namespace {

using Catch::Matchers::Contains;
using loom_test::temp_dir;
using pipeline = loom_test::gray_png<8, 8>;
using set_type = loom::data::image_shards<pipeline, 10>;
using loader_type = set_type::loader_type;
namespace fs = std::filesystem;

static_assert(std::is_same_v<loom::data::loader_for_t<set_type>, loader_type>);
static_assert(std::is_same_v<loom::data::loader_for_t<loom::data::fashion_mnist_set>,
                             loom::data::distributed_loader<loom::data::fashion_mnist_set>>);
static_assert(std::is_same_v<set_type::sample_shape, loom::shape<1, 8, 8>>);

/// One sample as a loader handed it: its index (from its pixels) and its label.
struct got {
  std::int64_t index;
  std::int32_t label;
  bool operator==(const got&) const = default;
  bool operator<(const got& o) const { return index < o.index; }
};

struct step {
  loom::data::batch_share share;
  std::vector<got> samples;
};

/// The rest of the current epoch as `loader` hands it out.
std::vector<step> rest_of_epoch(loader_type& loader, std::size_t max_steps = static_cast<std::size_t>(-1)) {
  std::vector<step> out;
  std::vector<float> x(loader.max_local_batch() * 64);
  std::vector<std::int32_t> labels(loader.max_local_batch());
  for (std::size_t k = 0; k < max_steps; ++k) {
    const auto share = loader.next(x.data(), labels.data());
    if (!share) break;
    step s{share, {}};
    for (std::size_t i = 0; i < share.local; ++i) s.samples.push_back({loom_test::decoded_index(x.data() + i * 64), labels[i]});
    out.push_back(std::move(s));
  }
  return out;
}

/// The global batches of epoch `epoch` put together from the loaders of all ranks of `world`.
std::vector<std::vector<got>> epoch_over(const set_type& set, int world, std::size_t batch, std::size_t epoch,
                                         std::uint64_t seed = 5) {
  std::vector<std::vector<step>> per_rank;
  for (int r = 0; r < world; ++r) {
    loader_type l(set, batch, seed, r, world);
    l.start_epoch(epoch);
    per_rank.push_back(rest_of_epoch(l));
  }
  std::vector<std::vector<got>> out(per_rank[0].size());
  for (int r = 0; r < world; ++r) {
    REQUIRE(per_rank[static_cast<std::size_t>(r)].size() == out.size());
    for (std::size_t k = 0; k < out.size(); ++k) {
      const step& s = per_rank[static_cast<std::size_t>(r)][k];
      CHECK(s.share.offset == out[k].size());  // the ranks' shares follow each other in rank order
      out[k].insert(out[k].end(), s.samples.begin(), s.samples.end());
      CHECK(s.share.global == per_rank[0][k].share.global);
    }
  }
  return out;
}

loom::data::shard_options opts(std::size_t streams, std::size_t window = 7) {
  loom::data::shard_options o;
  o.streams = streams;
  o.shuffle_window = window;
  o.decode_threads = 2;
  o.use_cache = false;
  return o;
}

const std::vector<std::uint64_t> uneven{13, 5, 21, 8, 1, 17, 9, 30};  // 104 samples in 8 shards

}  // namespace

TEST_CASE("Every sample of an epoch comes once over the ranks, with its label, for 1, 2 and 3 ranks",
          "[data][shard_loader]") {
  temp_dir dir;
  loom_test::write_index_shards(dir.path(), "train", uneven);
  const set_type set(dir.path().string(), "train", opts(6));
  CHECK(set.size() == 104);
  CHECK(set.streams() == 6);
  for (int world : {1, 2, 3}) {
    for (std::size_t epoch : {0, 1}) {
      const auto batches = epoch_over(set, world, 16, epoch);
      CHECK(batches.size() == 7);  // ceil(104 / 16)
      std::vector<int> seen(104, 0);
      for (std::size_t k = 0; k < batches.size(); ++k) {
        CHECK(batches[k].size() == (k + 1 < batches.size() ? 16u : 104u - 6 * 16));
        for (const got& g : batches[k]) {
          REQUIRE(g.index >= 0);
          REQUIRE(g.index < 104);
          ++seen[static_cast<std::size_t>(g.index)];
          CHECK(g.label == loom_test::test_label(static_cast<std::uint64_t>(g.index)));
        }
      }
      INFO("world " << world << ", epoch " << epoch);
      CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  }
}

TEST_CASE("The global batches are the same for every world size, and differ between epochs", "[data][shard_loader]") {
  temp_dir dir;
  loom_test::write_index_shards(dir.path(), "train", uneven);
  const set_type set(dir.path().string(), "train", opts(6));
  const auto one = epoch_over(set, 1, 10, 2);
  CHECK(epoch_over(set, 2, 10, 2) == one);
  CHECK(epoch_over(set, 3, 10, 2) == one);
  CHECK(epoch_over(set, 6, 10, 2) == one);
  CHECK(epoch_over(set, 1, 10, 3) != one);
  CHECK(epoch_over(set, 1, 10, 2, /*seed=*/6) != one);
  // Shuffled: not in index order within a batch.
  bool sorted = true;
  for (const auto& b : one) sorted = sorted && std::is_sorted(b.begin(), b.end());
  CHECK_FALSE(sorted);
}

TEST_CASE("skip() and a new loader at (epoch, step) continue at the same sample; reshard() mid-epoch loses none",
          "[data][shard_loader]") {
  temp_dir dir;
  loom_test::write_index_shards(dir.path(), "train", uneven);
  const set_type set(dir.path().string(), "train", opts(6, 5));
  const auto whole = epoch_over(set, 1, 12, 1);
  SECTION("skip") {
    for (std::size_t k : {0, 1, 4, 8}) {
      loader_type l(set, 12, 5, 0, 1);
      l.start_epoch(1);
      l.skip(k);
      const auto rest = rest_of_epoch(l);
      REQUIRE(rest.size() == whole.size() - std::min(k, whole.size()));
      for (std::size_t i = 0; i < rest.size(); ++i) CHECK(rest[i].samples == whole[k + i]);
    }
  }
  SECTION("reshard from 3 ranks to 2 after 4 steps, as after a recovery") {
    std::vector<got> all;
    std::vector<std::unique_ptr<loader_type>> ranks;
    for (int r = 0; r < 3; ++r) {
      ranks.push_back(std::make_unique<loader_type>(set, 12, 5, r, 3));
      ranks.back()->start_epoch(1);
      for (const step& s : rest_of_epoch(*ranks.back(), 4))
        all.insert(all.end(), s.samples.begin(), s.samples.end());
    }
    // Rank 1 dies; the survivors (0 and 2) become ranks 0 and 1 of 2 and finish the epoch.
    ranks[0]->reshard(0, 2);
    ranks[2]->reshard(1, 2);
    const auto a = rest_of_epoch(*ranks[0]);
    const auto b = rest_of_epoch(*ranks[2]);
    REQUIRE(a.size() == whole.size() - 4);
    REQUIRE(b.size() == a.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      std::vector<got> batch = a[k].samples;
      batch.insert(batch.end(), b[k].samples.begin(), b[k].samples.end());
      CHECK(batch == whole[4 + k]);
      all.insert(all.end(), batch.begin(), batch.end());
    }
    std::sort(all.begin(), all.end());
    REQUIRE(all.size() == 104);
    for (std::size_t i = 0; i < all.size(); ++i) CHECK(all[i].index == static_cast<std::int64_t>(i));
  }
  SECTION("a restart on another world size: new loaders at (epoch 1, step 5)") {
    std::vector<std::vector<got>> rest(whole.size() - 5);
    for (int r = 0; r < 4; ++r) {
      loader_type l(set, 12, 5, r, 4);
      l.start_epoch(1);
      l.skip(5);
      const auto mine = rest_of_epoch(l);
      REQUIRE(mine.size() == rest.size());
      for (std::size_t k = 0; k < mine.size(); ++k) rest[k].insert(rest[k].end(), mine[k].samples.begin(), mine[k].samples.end());
    }
    for (std::size_t k = 0; k < rest.size(); ++k) CHECK(rest[k] == whole[5 + k]);
  }
}

namespace {
std::atomic<int> decodes{0};
struct counting_png : pipeline {
  void operator()(std::span<const std::byte> b, const loom::data::sample_key& k, float* out) const {
    ++decodes;
    pipeline::operator()(b, k, out);
  }
};
}  // namespace

TEST_CASE("Labels-only reads decode nothing; share-only reads read nothing; a rank reads about its share",
          "[data][shard_loader]") {
  temp_dir dir;
  const auto shards = loom_test::write_index_shards(dir.path(), "train", std::vector<std::uint64_t>(8, 40));
  std::uint64_t total_bytes = 0;
  for (const auto& s : shards) total_bytes += fs::file_size(s);
  using counted = loom::data::image_shards<counting_png, 10>;
  const counted set(dir.path().string(), "train", opts(4, 16));
  std::vector<std::int32_t> all_labels, labels(64);
  std::vector<float> x(64 * 64);
  {
    counted::loader_type l(set, 64, 5, 0, 1);
    decodes = 0;
    while (l.next(x.data(), labels.data())) {
    }
    CHECK(decodes.load() == 320);
    l.start_epoch(0);
    std::size_t n = 0;
    while (const auto s = l.next(x.data(), labels.data())) {
      all_labels.insert(all_labels.end(), labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(s.local));
      n += s.local;
    }
    CHECK(n == 320);
  }
  {
    counted::loader_type l(set, 64, 5, 0, 1);
    decodes = 0;
    std::vector<std::int32_t> got_labels;
    while (const auto s = l.next(static_cast<float*>(nullptr), labels.data()))
      got_labels.insert(got_labels.end(), labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(s.local));
    CHECK(decodes.load() == 0);
    CHECK(got_labels == all_labels);
  }
  {
    counted::loader_type l(set, 64, 5, 1, 2);
    std::size_t steps = 0, samples = 0;
    while (const auto s = l.next(static_cast<float*>(nullptr), static_cast<std::int32_t*>(nullptr))) {
      ++steps;
      samples += s.local;
    }
    CHECK(steps == 5);
    CHECK(samples == 160);
    CHECK(l.bytes_read() == 0);
  }
  // Each of 2 ranks reads its 2 streams' shards, each once, and nothing else.
  const auto layout =
      loom::data::detail::deal_shards(std::vector<std::uint64_t>(8, 40), 4, /*seed=*/5, /*epoch=*/0, true);
  std::uint64_t sum = 0;
  for (int r = 0; r < 2; ++r) {
    counted::loader_type l(set, 64, 5, r, 2);
    while (l.next(x.data(), labels.data())) {
    }
    std::uint64_t mine = 0;
    for (std::size_t v = 2 * static_cast<std::size_t>(r); v < 2 * static_cast<std::size_t>(r) + 2; ++v)
      for (std::uint32_t s : layout.shards[v]) mine += fs::file_size(shards[s]);
    INFO("rank " << r << " read " << l.bytes_read() << " of " << total_bytes);
    CHECK(l.bytes_read() == mine);
    sum += l.bytes_read();
  }
  CHECK(sum == total_bytes);
}

TEST_CASE("Bad samples fail with shard, member and offset, or are skipped and counted", "[data][shard_loader]") {
  temp_dir dir;
  {
    loom::data::tar_writer w(dir / "bad-000000.tar");
    const auto png = [](std::uint64_t i) { return loom_test::png_gray(8, 8, loom_test::index_pixels(8, 8, i)); };
    for (std::uint64_t i = 0; i < 10; ++i) {
      char key[8];
      std::snprintf(key, sizeof key, "%06llu", static_cast<unsigned long long>(i));
      auto image = png(i);
      if (i == 3) image[40] ^= std::byte{0x55};  // a corrupt PNG (its CRC fails)
      w.add(std::string(key) + ".png", image);
      if (i == 5) continue;  // no label
      w.add(std::string(key) + ".cls", loom_test::to_bytes(i == 7 ? "10" : i == 8 ? "eight" : std::to_string(loom_test::test_label(i))));
    }
    w.close();
  }
  auto o = opts(1, 1);
  SECTION("fail") {
    const set_type set((dir / "bad-000000.tar").string(), "", o);
    loader_type l(set, 4, 5, 0, 1, /*shuffle=*/false);
    std::vector<float> x(4 * 64);
    std::vector<std::int32_t> labels(4);
    try {  // batch 0 holds samples 0..3: it fails as a whole
      (void)l.next(x.data(), labels.data());
      FAIL("no error");
    } catch (const loom::data_error& e) {
      CHECK_THAT(e.what(), Contains("loom: shard " + (dir / "bad-000000.tar").string() + ": member 000003.png at byte"));
      CHECK_THAT(e.what(), Contains("PNG does not decode"));
    }
  }
  SECTION("skip") {
    o.on_bad = loom::data::on_bad_sample::skip;
    const set_type set((dir / "bad-000000.tar").string(), "", o);
    std::vector<got> all;
    std::string err = loom_test::capture_stderr([&] {
      loader_type l(set, 4, 5, 0, 1, /*shuffle=*/false);
      std::size_t k = 0;
      for (const step& s : rest_of_epoch(l)) {
        CHECK(s.share.global == std::min<std::size_t>(4, 10 - 4 * k++));  // the skipped ones still counted
        all.insert(all.end(), s.samples.begin(), s.samples.end());
      }
    });
    std::vector<std::int64_t> indices;
    for (const got& g : all) {
      indices.push_back(g.index);
      CHECK(g.label == loom_test::test_label(static_cast<std::uint64_t>(g.index)));
    }
    CHECK(indices == std::vector<std::int64_t>{0, 1, 2, 4, 6, 9});
    const auto skipped = set.skipped();
    using loom::data::sample_problem;
    CHECK(skipped.total() == 4);
    CHECK(skipped.by_reason[static_cast<std::size_t>(sample_problem::bad_image)] == 1);
    CHECK(skipped.by_reason[static_cast<std::size_t>(sample_problem::no_label)] == 1);
    CHECK(skipped.by_reason[static_cast<std::size_t>(sample_problem::label_out_of_range)] == 1);
    CHECK(skipped.by_reason[static_cast<std::size_t>(sample_problem::label_not_a_number)] == 1);
    CHECK(skipped.summary() == "4 samples skipped: 1 without a label, 1 whose label is not a number, 1 whose label "
                               "is out of range, 1 whose image does not decode");
    CHECK_THAT(err, Contains("loom: skipping a bad sample (on_bad_sample::skip): loom: shard"));
    CHECK_THAT(err, Contains("holds class 10, out of range: expected 0..9"));
    CHECK_THAT(err, Contains("4 bad samples left out by this loader"));
  }
}

TEST_CASE("More ranks than streams, and rank blocks, are refused with a sentence", "[data][shard_loader]") {
  temp_dir dir;
  loom_test::write_index_shards(dir.path(), "train", {4, 4});
  CHECK(set_type(dir.path().string(), "train", opts(0)).streams() == 16);  // whatever the number of shards
  const set_type set(dir.path().string(), "train", opts(2));
  CHECK_THROWS_WITH(loader_type(set, 8, 1, 2, 3), Contains("3 ranks, but") && Contains("is dealt into 2 streams") &&
                                                      Contains("shard_options::streams"));
  loader_type l(set, 8, 1, 0, 2);
  l.set_rank_block(0);
  CHECK_THROWS_WITH(l.set_rank_block(16), Contains("deterministic_chunk (16 samples per rank block) is not supported"));
  CHECK_THROWS_WITH(l.reshard(0, 3), Contains("3 ranks, but"));
  CHECK(set.identity() == "shards:" + set.manifest().fingerprint() + ";samples=8;streams=2;window=7");
}

TEST_CASE("1,000 corrupted shards: each is refused with a message or read correctly, none crashes",
          "[data][shard_loader][fuzz]") {
  temp_dir dir;
  const auto shard = loom_test::write_index_shard(dir / "fuzz-000000.tar", 0, 24);
  const loom_test::bytes original = loom_test::file_bytes(shard);
  // Where each sample's label text lies: a corrupted label byte is read as written (tar has no
  // checksum over data), so the expected label is what the corrupted text says.
  std::map<std::uint64_t, std::pair<std::size_t, std::size_t>> label_at;  // index -> (offset, size)
  {
    loom::data::tar_reader r(shard);
    while (auto e = r.next()) {
      const auto n = loom::data::split_member_name(e->name);
      if (n.extension == "cls") label_at[std::stoull(n.key)] = {e->data_offset, e->size};
    }
  }
  std::mt19937_64 rng(20240601);
  int refused = 0, read = 0, changed_labels = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    loom_test::bytes b = original;
    std::vector<std::size_t> touched;
    const int kind = trial % 4;
    const bool fix_manifest = trial % 8 < 4;  // else the manifest's size check may refuse it first
    if (kind == 0) {  // byte flips anywhere
      for (int f = 0; f < 1 + static_cast<int>(rng() % 4); ++f) {
        const std::size_t at = rng() % b.size();
        b[at] ^= static_cast<std::byte>(1 + rng() % 255);
        touched.push_back(at);
      }
    } else if (kind == 1) {  // truncation
      b.resize(rng() % b.size());
    } else {  // a header field damaged, its checksum made right again half the time
      const std::size_t headers = b.size() / 512;
      std::size_t h = 0;
      for (int tries = 0; tries < 100; ++tries) {
        h = (rng() % headers) * 512;
        if (loom::data::detail::tar_header_block("x", 0)[257] == static_cast<char>(b[h + 257])) break;
      }
      static constexpr std::size_t fields[][2] = {{0, 100}, {100, 8}, {124, 12}, {156, 1}, {257, 8}, {345, 155}};
      const auto& f = fields[rng() % 6];
      for (std::size_t i = 0; i < f[1]; ++i)
        if (rng() % 3 == 0) b[h + f[0] + i] = static_cast<std::byte>(rng() % 3 == 0 ? '0' + rng() % 10 : rng() % 256);
      if (kind == 3) {
        for (int i = 148; i < 156; ++i) b[h + i] = std::byte{' '};
        unsigned sum = 0;
        for (int i = 0; i < 512; ++i) sum += static_cast<unsigned>(b[h + i]);
        char digits[8];
        std::snprintf(digits, sizeof digits, "%06o", sum & 0777777);
        for (int i = 0; i < 6; ++i) b[h + 148 + i] = static_cast<std::byte>(digits[i]);
        b[h + 154] = std::byte{0};
      }
      for (std::size_t i = 0; i < 512; ++i) touched.push_back(h + i);
    }
    loom_test::write_file(shard, b);
    loom::data::shard_manifest m;
    m.classes = 10;
    m.shards = {{shard, fix_manifest ? b.size() : original.size(), 24}};
    loom_test::write_file(dir / "fuzz.shards.json", loom_test::to_bytes(loom::data::manifest_json(m, dir.path())));
    auto o = opts(1, 5);
    o.decode_threads = 1;
    o.on_bad = trial % 2 ? loom::data::on_bad_sample::skip : loom::data::on_bad_sample::fail;
    std::vector<got> delivered;
    std::string message;
    (void)loom_test::capture_stderr([&] {
      try {
        const set_type set(shard.string(), "", o);
        loader_type l(set, 8, 1, 0, 1);
        std::vector<float> x(8 * 64);
        std::vector<std::int32_t> labels(8);
        while (const auto s = l.next(x.data(), labels.data()))
          for (std::size_t i = 0; i < s.local; ++i)
            delivered.push_back({loom_test::decoded_index(x.data() + i * 64), labels[i]});
      } catch (const loom::error& e) {
        message = e.what();
      }
    });
    INFO("trial " << trial << " (kind " << kind << "): " << message);
    if (!message.empty()) {
      ++refused;
      CHECK((Contains(shard.string()).match(message) || Contains("manifest").match(message)));
    } else {
      ++read;
    }
    // Whatever came before a refusal, or all of a read, must be right: a sample's image is its
    // own (the PNG's checksums), its label the one written for it, or what a damaged label
    // byte now says.
    for (const got& g : delivered) {
      REQUIRE(g.index >= 0);
      REQUIRE(g.index < 24);
      const auto [off, size] = label_at[static_cast<std::uint64_t>(g.index)];
      bool label_damaged = false;
      for (std::size_t t : touched) label_damaged = label_damaged || (t >= off && t < off + size);
      if (label_damaged) {
        std::string text;
        for (std::size_t i = off; i < off + size && i < b.size(); ++i) text += static_cast<char>(b[i]);
        const auto parsed = loom::data::parse_class_index(text);
        REQUIRE(parsed);
        CHECK(g.label == *parsed);
        ++changed_labels;
      } else {
        CHECK(g.label == loom_test::test_label(static_cast<std::uint64_t>(g.index)));
      }
    }
  }
  WARN("fuzz: " << refused << " refused with a message, " << read << " read; " << changed_labels
                << " labels read as their damaged text says");
  CHECK(refused > 100);
  CHECK(read > 100);
}
