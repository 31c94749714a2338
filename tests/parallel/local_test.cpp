// SPDX-License-Identifier: Apache-2.0
// data_parallel over loom::local_comm (ranks as threads of this process): the compile-time
// bucket plan, equivalence with single-process training, reproducibility, accumulation and the
// start-up checks.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common.hpp"
#include "loom/comm/local.hpp"
#include "rank_results.hpp"

using namespace loom_test;
using local_dp = loom::data_parallel<loom::local_comm>;

// mlp: layer 0 has 784*256+256 = 200,960 parameters, layer 2 32,896, layer 4 1,290.
using small_buckets = loom::bucket_plan<mlp, float, 512 * 1024>;
static_assert(small_buckets::count == 2);
static_assert(small_buckets::buckets[0].first_layer == 2 && small_buckets::buckets[0].last_layer == 4);
static_assert(small_buckets::buckets[0].offset == 200960 && small_buckets::buckets[0].count == 32896 + 1290);
static_assert(small_buckets::buckets[0].ready_after == 2);
static_assert(small_buckets::buckets[1].offset == 0 && small_buckets::buckets[1].count == 200960);
static_assert(small_buckets::starts_after_layer[2] == 0 && small_buckets::starts_after_layer[0] == 1);
static_assert(small_buckets::starts_after_layer[4] == small_buckets::count);  // no bucket starts after layer 4
// The default cap (25 MiB) holds the whole mlp in one bucket; a tiny cap gives one per layer.
static_assert(loom::bucket_plan<mlp, float, 25u << 20>::count == 1);
static_assert(loom::bucket_plan<mlp, float, 4>::count == 3);
static_assert(local_dp::bucket_cap_bytes == 25u << 20);
static_assert(loom::data_parallel<loom::local_comm, loom::bucket_bytes<1024>>::bucket_cap_bytes == 1024);

namespace {

template <class Net, class Optimizer = loom::sgd>
std::vector<float> train_local(int ranks, std::size_t n, std::size_t batch, std::size_t accumulation = 1,
                               typename Optimizer::options opt = {.lr = 0.02f, .momentum = 0.9f}) {
  std::vector<std::vector<float>> params(static_cast<std::size_t>(ranks));
  loom::local_world(ranks).run([&](loom::local_comm& c) {
    loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, local_dp> t{c, opt, {.seed = 1, .threads = 1}};
    t.fit(train_set(), steps(n, batch, accumulation));
    auto p = t.model().parameters();
    params[static_cast<std::size_t>(c.rank())].assign(p.begin(), p.end());
  });
  for (int r = 1; r < ranks; ++r) REQUIRE(params[static_cast<std::size_t>(r)] == params[0]);  // replicas identical
  return params[0];
}

}  // namespace

TEST_CASE("The bucket plan is computed at compile time from the network type", "[parallel]") {
  STATIC_REQUIRE(small_buckets::count == 2);
  STATIC_REQUIRE(small_buckets::buckets[1].ready_after == 0);
}

TEST_CASE("ZeRO's gather units follow the forward: small layers together, a large one alone, within a bucket",
          "[parallel][zero]") {
  // The cnn under the default caps: bucket 0 = linear<10> (1 MiB first cap); bucket 1 = the two
  // convolutions and linear<128>. Layers: 0 conv 320, 3 conv 18,496, 7 linear 401,536, 9 linear 1,290.
  using plan = loom::bucket_plan<cnn, float, 25u << 20>;
  static_assert(plan::count == 2);
  for (std::size_t ranks : {1, 2, 3, 4}) {
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      const auto z = loom::zero_layout::make(plan::buckets, rank, ranks, cnn::parameter_counts);
      // The convolutions (75 KB) in one unit; linear<128> (1.6 MB) above the 1 MiB cap alone;
      // then bucket 0. In the forward's order.
      REQUIRE(z.units.size() == 3);
      CHECK(z.units[0].offset == 0);
      CHECK(z.units[0].count == 320 + 18496);
      CHECK(z.units[1].offset == 320 + 18496);
      CHECK(z.units[1].count == 401536);
      CHECK(z.units[2].offset == plan::buckets[0].offset);
      CHECK(z.units[2].count == 1290);
      CHECK(z.layer_unit[0] == 0);
      CHECK(z.layer_unit[3] == 0);
      CHECK(z.layer_unit[7] == 1);
      CHECK(z.layer_unit[9] == 2);
      CHECK(z.layer_unit[1] == z.units.size());  // a ReLU: nothing to wait for
      // Each unit's counts cover it, in rank order, each rank sending what it owns of it.
      for (std::size_t u = 0; u < 3; ++u) {
        std::size_t sum = 0;
        for (std::size_t j = 0; j < ranks; ++j) sum += z.unit_counts_of(u)[j];
        CHECK(sum == z.units[u].count);
      }
      // What this rank sends of the units is exactly its shard.
      std::size_t mine = 0;
      for (std::size_t u = 0; u < 3; ++u) mine += z.unit_counts_of(u)[rank];
      CHECK(mine == z.shard_count);
    }
  }
  // Without the layers' counts: one unit per bucket, the last bucket first.
  const auto z = loom::zero_layout::make(plan::buckets, 0, 2);
  REQUIRE(z.units.size() == 2);
  CHECK(z.units[0].offset == plan::buckets[1].offset);
  CHECK(z.units[1].count == plan::buckets[0].count);
}

TEST_CASE("LOOM_ZERO_GATHER takes overlapped or blocking, and names anything else", "[parallel][zero]") {
  using zero_local = loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>;
  auto make = [] {
    bool overlapped = false;
    loom::local_world(1).run([&](loom::local_comm& c) {
      loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, zero_local> t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
      overlapped = t.engine().sync().gather_overlapped();
    });
    return overlapped;
  };
  ::unsetenv("LOOM_ZERO_GATHER");
  CHECK(make());
  ::setenv("LOOM_ZERO_GATHER", "blocking", 1);
  CHECK_FALSE(make());
  ::setenv("LOOM_ZERO_GATHER", "overlapped", 1);
  CHECK(make());
  ::setenv("LOOM_ZERO_GATHER", "sideways", 1);
  CHECK_THROWS_WITH(make(), Catch::Contains("LOOM_ZERO_GATHER='sideways'") && Catch::Contains("blocking"));
  ::unsetenv("LOOM_ZERO_GATHER");
}

TEMPLATE_TEST_CASE("N local ranks with global batch B end where 1 rank with batch B does, after 50 steps", "[parallel]",
                   mlp, smooth_mlp, smooth_cnn) {
  const auto ref = reference<TestType>(50, 64);
  for (int ranks : {2, 4}) {
    const auto dp = train_local<TestType>(ranks, 50, 64);
    INFO(ranks << " ranks");
    CHECK(relative_distance(dp, ref) <= 1e-5);
  }
}

TEST_CASE("The example's cnn on N local ranks matches 1 rank after 20 steps", "[parallel]") {
  // See common.hpp: past ~25 steps a kink flip decides, not the arithmetic.
  const auto ref = reference<cnn>(20, 64);
  for (int ranks : {2, 4}) {
    INFO(ranks << " ranks");
    CHECK(relative_distance(train_local<cnn>(ranks, 20, 64), ref) <= 1e-5);
  }
}

TEST_CASE("An uneven split and a short last batch still match one rank", "[parallel]") {
  // 3 ranks share batches of 50 (16 + 17 + 17); 3,200 = 64 * 50, so 64 steps run one epoch
  // exactly, and 70 steps cross into the second.
  const auto ref = reference<smooth_mlp>(70, 50);
  CHECK(relative_distance(train_local<smooth_mlp>(3, 70, 50), ref) <= 1e-5);
  // 7 ranks and batches of 6: one rank gets no sample at all in every step.
  const auto ref6 = reference<mlp>(12, 6);
  CHECK(relative_distance(train_local<mlp>(7, 12, 6), ref6) <= 1e-5);
}

TEST_CASE("The same seed and world size give bitwise identical parameters", "[parallel]") {
  CHECK(train_local<cnn>(2, 10, 64) == train_local<cnn>(2, 10, 64));
}

TEST_CASE("Accumulating k micro-batches of B/k equals one batch of B", "[parallel]") {
  const auto ref = reference<mlp>(20, 64);
  CHECK(relative_distance(train_local<mlp>(2, 20, 32, 2), ref) <= 1e-5);
  CHECK(relative_distance(train_local<mlp>(1, 20, 16, 4), ref) <= 1e-5);
}

TEST_CASE("Ranks configured differently all stop with a message naming the ranks and the difference", "[parallel]") {
  std::mutex m;
  std::vector<std::string> messages;
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    try {
      t.fit(train_set(), steps(5, c.rank() == 0 ? 64 : 32));
    } catch (const loom::communication_error& e) {
      std::lock_guard lock(m);
      messages.push_back(e.what());
    }
  });
  REQUIRE(messages.size() == 2);
  for (const auto& msg : messages) {
    CHECK_THAT(msg, Catch::Contains("rank 1 differs from rank 0"));
    CHECK_THAT(msg, Catch::Contains("[batch=32] where rank 0 has [batch=64]"));
  }
}

TEST_CASE("Ranks built with different seeds are told apart at construction", "[parallel]") {
  std::atomic<int> caught{0};
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{
          c, {.lr = 0.02f}, {.seed = static_cast<std::uint64_t>(1 + c.rank()), .threads = 1}};
    } catch (const loom::communication_error& e) {
      if (std::string(e.what()).find("[seed=2] where rank 0 has [seed=1]") != std::string::npos) ++caught;
    }
  });
  CHECK(caught == 2);
}

TEST_CASE("Ranks built with different networks are told which, in the types as written", "[parallel]") {
  std::mutex m;
  std::vector<std::string> messages;
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      if (c.rank() == 0)
        loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
      else
        loom::trainer<smooth_mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    } catch (const loom::communication_error& e) {
      std::lock_guard lock(m);
      messages.push_back(e.what());
    }
  });
  REQUIRE(messages.size() == 2);
  for (const auto& msg : messages) {
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("rank 1 differs from rank 0: [network=loom::network<loom::input<784>, loom::linear<256"));
    CHECK_THAT(msg, Catch::Contains("loom::tanh") && Catch::Contains("where rank 0 has [network=loom::network<"));
    CHECK_THAT(msg, !Catch::Contains("N4loom"));  // no mangled names
  }
}

TEST_CASE("Each rank's figures are gathered on every rank", "[parallel]") {
  const auto results = loom::testing::on_local_ranks(2, [&](loom::local_comm& c) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
    return t.fit(train_set(), steps(10, 64));
  });
  for (std::size_t rank = 0; rank < results.size(); ++rank) {
    const auto& r = results[rank];
    INFO("rank " << rank);
    REQUIRE(r.figures.size() == 2);
    for (const auto& f : r.figures) {
      CHECK(f.samples == 320);  // 10 steps x 32 samples each
      CHECK(f.compute_s > 0);
      CHECK(f.bytes_sent == Approx(10 * 2.0 * 0.5 * mlp::parameter_count * 4));
    }
    CHECK(r.ranks == 2);
    CHECK(r.samples == 640);
  }
}

// As PyTorch DDP, the first bucket is capped at 1 MiB so communication starts early: the cnn's
// last layer (1,290 parameters) is alone, since adding linear<128> (401,536) passes 1 MiB; the
// rest fits one 25 MiB bucket. With bucket_bytes<1 MiB>, linear<128> gets a bucket of its own
// that starts while the convolutions' backward runs.
using cnn_buckets = loom::bucket_plan<cnn, float, 25u << 20>;
static_assert(cnn_buckets::count == 2);
static_assert(cnn_buckets::buckets[0].first_layer == 9 && cnn_buckets::buckets[0].count == 1290);
static_assert(cnn_buckets::buckets[1].first_layer == 0 && cnn_buckets::buckets[1].last_layer == 7);
static_assert(cnn_buckets::buckets[1].offset == 0 && cnn_buckets::buckets[1].count == 320 + 18496 + 3136 * 128 + 128);
using cnn_small_buckets = loom::bucket_plan<cnn, float, 1u << 20>;
static_assert(cnn_small_buckets::count == 3);
static_assert(cnn_small_buckets::buckets[1].first_layer == 7 && cnn_small_buckets::buckets[1].last_layer == 7);
static_assert(cnn_small_buckets::buckets[2].first_layer == 0 && cnn_small_buckets::buckets[2].count == 320 + 18496);
static_assert(cnn_small_buckets::starts_after_layer[7] == 1 && cnn_small_buckets::starts_after_layer[0] == 2);

TEST_CASE("Ranks asking for different math modes are told apart at construction", "[parallel]") {
  // bf16 on one rank and fp32 on another would average gradients of different computations.
  // The job check comes before the math check, so this holds on a CPU without bf16 too.
  std::atomic<int> caught{0};
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{
          c, {.lr = 0.02f}, {.seed = 1, .threads = 1, .math = c.rank() == 0 ? loom::math_mode::fp32 : loom::math_mode::bf16}};
    } catch (const loom::communication_error& e) {
      if (std::string(e.what()).find("[math=bf16] where rank 0 has [math=fp32]") != std::string::npos) ++caught;
    }
  });
  CHECK(caught == 2);
}
