// SPDX-License-Identifier: Apache-2.0
// Deterministic (split-invariant) data parallelism, fit_options::deterministic_chunk, over
// loom::local_comm: the chunk plan and its errors, the order of the chunk tree's additions, and
// bitwise equality of N ranks with one process — the example's ReLU/max-pool cnn included, over
// 50 steps, where the default mode drifts (common.hpp).

#include <catch2/catch.hpp>

#include <cstdio>
#include <mutex>
#include <string>

#include "common.hpp"
#include "loom/comm/local.hpp"

using namespace loom_test;
using local_dp = loom::data_parallel<loom::local_comm>;

namespace {

loom::fit_options chunked(std::size_t n, std::size_t batch, std::size_t chunk, std::size_t accumulation = 1) {
  auto o = steps(n, batch, accumulation);
  o.deterministic_chunk = chunk;
  return o;
}

const loom::sgd::options momentum{.lr = 0.02f, .momentum = 0.9f};

template <class Net, class Dataset>
std::vector<float> alone(const Dataset& data, const loom::fit_options& o) {
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{momentum, {.seed = 1, .threads = 1}};
  t.fit(data, o);
  auto p = t.model().parameters();
  return {p.begin(), p.end()};
}

template <class Net, class Dataset>
std::vector<float> on_ranks(int ranks, const Dataset& data, const loom::fit_options& o) {
  std::vector<std::vector<float>> params(static_cast<std::size_t>(ranks));
  loom::local_world(ranks).run([&](loom::local_comm& c) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, momentum, {.seed = 1, .threads = 1}};
    t.fit(data, o);
    auto p = t.model().parameters();
    params[static_cast<std::size_t>(c.rank())].assign(p.begin(), p.end());
  });
  for (int r = 1; r < ranks; ++r) REQUIRE(params[static_cast<std::size_t>(r)] == params[0]);  // replicas identical
  return params[0];
}

}  // namespace

TEST_CASE("The chunk plan deals whole aligned chunks and rejects what it cannot make split-invariant",
          "[parallel][deterministic]") {
  const auto even = loom::chunk_plan::make(64, 16, 4);
  CHECK(even.chunks_per_batch == 4);
  CHECK(even.chunks_per_rank == 1);
  CHECK(even.rank_block() == 16);
  CHECK(even.has_samples(3, 64));
  CHECK_FALSE(even.has_samples(1, 16));  // a tail of one chunk: only rank 0 has samples
  // 3 chunks on 2 ranks: the tree is padded to 4 leaves, rank 0 takes 2 chunks, rank 1 one.
  const auto padded = loom::chunk_plan::make(48, 16, 2);
  CHECK(padded.chunks_per_batch == 3);
  CHECK(padded.chunks_per_rank == 2);
  // More ranks than chunks: each rank's subtree is one leaf.
  CHECK(loom::chunk_plan::make(64, 16, 1).chunks_per_rank == 4);

  auto message = [](std::size_t batch, std::size_t chunk, std::size_t ranks) {
    try {
      loom::chunk_plan::make(batch, chunk, ranks);
    } catch (const loom::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const auto three = message(64, 16, 3);
  CHECK_THAT(three, Catch::Contains("deterministic_chunk=16 with batch=64 on 3 ranks"));
  CHECK_THAT(three, Catch::Contains("power-of-two number of ranks"));
  CHECK_THAT(three, Catch::Contains("found 3: run on 2 or 4 ranks, or set deterministic_chunk = 0"));
  const auto idle = message(64, 64, 2);
  CHECK_THAT(idle, Catch::Contains("a full batch makes 1 chunk of at most 64 samples, which leaves 1 rank without "
                                   "samples in every step"));
  CHECK_THAT(idle, Catch::Contains("use a chunk of at most 32 samples"));
  CHECK_THAT(message(64, 0, 1), Catch::Contains("expected a chunk and a batch of at least 1 sample"));
}

TEST_CASE("The chunk tree adds in the padded binary tree over the chunk index", "[parallel][deterministic]") {
  // Values whose sum depends on the order of additions in float: 1e8 + 1 rounds the 1 away.
  const std::vector<std::vector<float>> leaves = {{1e8f, 1}, {1, 3}, {-1e8f, 5}, {1, 7}, {1, 11}};
  loom::gradient_tree<float, loom::cpu> tree;
  tree.reset(2);
  for (const auto& l : leaves) tree.push(l.data());
  std::vector<float> root(2, -1);
  REQUIRE(tree.fold(root.data()));
  CHECK(tree.empty());
  // ((l0 + l1) + (l2 + l3)) + l4, in float.
  const float want = ((leaves[0][0] + leaves[1][0]) + (leaves[2][0] + leaves[3][0])) + leaves[4][0];
  const float in_order = (((leaves[0][0] + leaves[1][0]) + leaves[2][0]) + leaves[3][0]) + leaves[4][0];
  REQUIRE(want != in_order);  // the case tells the tree from a running sum
  CHECK(root[0] == want);
  CHECK(root[1] == 27);
  // Nothing pushed: fold writes nothing.
  CHECK_FALSE(tree.fold(root.data()));
  CHECK(root[0] == want);
}

TEMPLATE_TEST_CASE("In deterministic mode N local ranks with global batch B end bitwise where 1 rank does, after 50 steps",
                   "[parallel][deterministic]", mlp, cnn) {
  const auto o = chunked(50, 64, 16);
  const auto ref = alone<TestType>(train_set(), o);
  // data_parallel on one rank runs the same code as single_process.
  CHECK(on_ranks<TestType>(1, train_set(), o) == ref);
  for (int ranks : {2, 4}) {
    const auto dp = on_ranks<TestType>(ranks, train_set(), o);
    const double d = relative_distance(dp, ref);
    std::printf("deterministic mode, %s, %d local ranks, 50 steps of 64 in chunks of 16: relative L2 distance to 1 rank %.3g\n",
                TestType::parameter_count == mlp::parameter_count ? "mlp" : "cnn", ranks, d);
    INFO(ranks << " ranks: relative distance " << d);
    CHECK(d <= 1e-5);
    CHECK(dp == ref);  // bitwise
  }
}

TEST_CASE("In deterministic mode a tail batch that leaves ranks without samples still matches 1 rank bitwise",
          "[parallel][deterministic]") {
  // 680 = 10 x 64 + 40: the last batch of each epoch has chunks of 16, 16 and 8, so on 4 ranks
  // rank 3 gets nothing and rank 2 a short chunk; 656 = 10 x 64 + 16: one chunk, rank 0's.
  // 24 steps cross the epoch boundaries.
  for (std::size_t size : {680, 656}) {
    const auto data = loom::data::fashion_mnist(loom::data::split::train).first(size);
    const auto o = chunked(24, 64, 16);
    const auto ref = alone<mlp>(data, o);
    for (int ranks : {2, 4}) {
      INFO(size << " samples, " << ranks << " ranks");
      CHECK(on_ranks<mlp>(ranks, data, o) == ref);
    }
  }
}

TEST_CASE("In deterministic mode accumulating 2 micro-batches of 32 equals one batch of 64 bitwise, on any ranks",
          "[parallel][deterministic]") {
  // 4 chunks in 2 micro-steps are added in the tree of 4 chunks in one step.
  const auto ref = alone<mlp>(train_set(), chunked(20, 64, 16));
  CHECK(alone<mlp>(train_set(), chunked(20, 32, 16, 2)) == ref);
  CHECK(on_ranks<mlp>(2, train_set(), chunked(20, 32, 16, 2)) == ref);
}

TEST_CASE("Deterministic mode on 3 ranks stops every rank with a message naming batch, chunk, ranks and what works",
          "[parallel][deterministic]") {
  std::mutex m;
  std::vector<std::string> messages;
  loom::local_world(3).run([&](loom::local_comm& c) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, momentum, {.seed = 1, .threads = 1}};
    try {
      t.fit(train_set(), chunked(5, 64, 16));
    } catch (const loom::invalid_argument& e) {
      std::lock_guard lock(m);
      messages.push_back(e.what());
    }
  });
  REQUIRE(messages.size() == 3);
  for (const auto& msg : messages)
    CHECK_THAT(msg, Catch::Contains("deterministic_chunk=16 with batch=64 on 3 ranks: deterministic mode needs a "
                                    "power-of-two number of ranks (1, 2, 4, 8, ...), found 3"));
}
