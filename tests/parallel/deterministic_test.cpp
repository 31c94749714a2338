// SPDX-License-Identifier: Apache-2.0
// Deterministic (split-invariant) data parallelism, fit_options::deterministic_chunk, over
// loom::local_comm: the chunk plan and its errors on 1 to 8 ranks, the loader's dealing, the
// order of the chunk tree's additions, the nodes of the canonical tree each rank computes, the
// exchange on 1 to 8 ranks against one rank's tree, and bitwise equality of N ranks (powers of
// two or not) with one process — the example's ReLU/max-pool cnn included, over 50 steps,
// where the default mode drifts (common.hpp).

#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common.hpp"
#include "exchange_check.hpp"
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
  // Any number of ranks: 4 chunks on 3 ranks, 2, 1 and 1.
  CHECK(message(64, 16, 3) == "(no error)");
  const auto three = loom::chunk_plan::make(64, 16, 3);
  CHECK(three.chunks_per_rank == 2);
  CHECK(three.chunks_of(0, 64) == std::pair<std::size_t, std::size_t>{0, 2});
  CHECK(three.chunks_of(1, 64) == std::pair<std::size_t, std::size_t>{2, 3});
  CHECK(three.chunks_of(2, 64) == std::pair<std::size_t, std::size_t>{3, 4});
  CHECK_FALSE(three.has_samples(2, 40));  // a tail of 3 chunks: rank 2 has none
  const auto few = message(64, 32, 3);
  CHECK_THAT(few, Catch::Contains("deterministic_chunk=32 with batch=64 on 3 ranks: a full batch makes 2 chunks of at "
                                  "most 32 samples, which leaves 1 rank without samples in every step"));
  CHECK_THAT(few, Catch::Contains("use a chunk of at most 21 samples"));
  CHECK_THAT(message(64, 16, 0), Catch::Contains("expected at least 1 rank, found 0"));
  const auto idle = message(64, 64, 2);
  CHECK_THAT(idle, Catch::Contains("a full batch makes 1 chunk of at most 64 samples, which leaves 1 rank without "
                                   "samples in every step"));
  CHECK_THAT(idle, Catch::Contains("use a chunk of at most 32 samples"));
  CHECK_THAT(message(64, 0, 1), Catch::Contains("expected a chunk and a batch of at least 1 sample"));
}

TEST_CASE("The chunk plan refuses a rank's samples that do not start at its first chunk, naming both offsets",
          "[parallel][deterministic]") {
  const auto three = loom::chunk_plan::make(64, 16, 3);  // chunks 0-1, 2, 3
  CHECK_NOTHROW(three.check_offset(0, 64, 32, 0));
  CHECK_NOTHROW(three.check_offset(1, 64, 16, 32));
  CHECK_NOTHROW(three.check_offset(2, 40, 0, 7));  // no samples: nothing to place
  auto message = [&](std::size_t r, std::size_t global_n, std::size_t n, std::size_t offset) {
    try {
      three.check_offset(r, global_n, n, offset);
    } catch (const loom::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(message(1, 64, 16, 16) ==
        "loom::trainer::fit: deterministic mode: replica 1 of 3 expected the samples from 32 of the global batch, "
        "found them from 16 (the loader does not deal as the chunk plan says)");
  CHECK_THAT(message(2, 64, 16, 32), Catch::Contains("replica 2 of 3 expected the samples from 48") &&
                                          Catch::Contains("found them from 32"));
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

TEST_CASE("On 1 to 8 ranks the plan deals contiguous, nearly equal ranges of chunks, and the loader deals the same",
          "[parallel][deterministic]") {
  const auto& data = train_set();
  for (std::size_t batch : {64, 48, 100, 112, 128}) {
    for (std::size_t chunk : {16, 7}) {
      const std::size_t k = (batch + chunk - 1) / chunk;
      for (std::size_t ranks = 1; ranks <= 8; ++ranks) {
        INFO("batch " << batch << ", chunk " << chunk << ", " << ranks << " ranks");
        if (k < ranks) {
          CHECK_THROWS_AS(loom::chunk_plan::make(batch, chunk, ranks), loom::invalid_argument);
          continue;
        }
        const auto p = loom::chunk_plan::make(batch, chunk, ranks);
        CHECK(p.chunks_per_batch == k);
        CHECK(p.rank_block() == chunk);
        CHECK(p.first_chunk(0) == 0);
        CHECK(p.first_chunk(ranks) == k);
        std::size_t most = 0;
        for (std::size_t r = 0; r < ranks; ++r) {
          const std::size_t held = p.first_chunk(r + 1) - p.first_chunk(r);
          CHECK((held == k / ranks || held == k / ranks + 1));  // nearly equal, at least 1
          CHECK(held >= 1);
          if (r > 0) CHECK(held <= p.first_chunk(r) - p.first_chunk(r - 1));  // the first ranks take the extra
          most = std::max(most, held);
        }
        CHECK(p.chunks_per_rank == most);
        // Every size of global batch, full or tail: the ranks' ranges tile [0, ceil(n / C)) in
        // order, and the loader deals exactly their samples.
        for (std::size_t n = 1; n <= batch; ++n) {
          std::size_t next = 0;
          for (std::size_t r = 0; r < ranks; ++r) {
            const auto [f, l] = p.chunks_of(r, n);
            CHECK(f == next);
            next = l;
            CHECK(p.has_samples(r, n) == (l > f));
          }
          CHECK(next == p.chunks_in(n));
        }
        // The loader over a data set whose epoch ends with a tail of 40 samples.
        const std::size_t size = 3 * batch + 40;
        for (std::size_t r = 0; r < ranks; ++r) {
          const auto sub = data.first(size);
          loom::data::distributed_loader<std::decay_t<decltype(sub)>> loader(sub, batch, 1, static_cast<int>(r),
                                                                              static_cast<int>(ranks));
          loader.set_rank_block(p.rank_block());
          std::vector<float> x(loader.max_local_batch() * 784);
          std::vector<std::int32_t> labels(loader.max_local_batch());
          CHECK(loader.max_local_batch() == std::min(batch, p.chunks_per_rank * chunk));
          for (std::size_t step = 0; step < 4; ++step) {
            const auto share = loader.next(x.data(), labels.data());
            const std::size_t n = step < 3 ? batch : 40;
            const auto [f, l] = p.chunks_of(r, n);
            INFO("rank " << r << ", step " << step);
            CHECK(share.global == n);
            CHECK(share.local == std::min(n, l * chunk) - std::min(n, f * chunk));
            if (share.local > 0) CHECK(share.offset == f * chunk);
          }
        }
      }
    }
  }
}

TEST_CASE("The chunk tree from any chunk holds the maximal aligned subtrees, and takes aligned subtrees whole",
          "[parallel][deterministic]") {
  const std::size_t n = 3;
  loom::gradient_tree<float, loom::cpu> t;
  for (std::size_t first = 0; first < 20; ++first) {
    for (std::size_t last = first; last <= 20; ++last) {
      t.reset(n, first);
      for (std::size_t k = first; k < last; ++k) t.push(loom_test::chunk_gradient(k, n).data());
      const auto want = loom::aligned_subtrees(first, last);
      INFO("chunks [" << first << ", " << last << ")");
      REQUIRE(t.subtrees() == want.size());
      std::size_t at = first;
      for (std::size_t i = 0; i < want.size(); ++i) {
        CHECK(t.node(i) == want[i]);
        CHECK(want[i].first == at);  // contiguous
        CHECK(std::has_single_bit(want[i].leaves));
        CHECK(want[i].first % want[i].leaves == 0);  // aligned
        if (i > 0)  // maximal: no two neighbours are siblings
          CHECK_FALSE((want[i - 1].leaves == want[i].leaves && want[i - 1].first % (2 * want[i].leaves) == 0));
        at += want[i].leaves;
      }
      CHECK(at == last);
    }
  }
  // Whole subtrees pushed: the same bits as their chunks one by one.
  const auto ref = loom_test::one_rank_root(13, n);
  t.reset(n);
  loom::gradient_tree<float, loom::cpu> part;
  for (const auto& node : loom::aligned_subtrees(0, 13)) {
    part.reset(n, node.first);
    for (std::size_t k = node.first; k < node.first + node.leaves; ++k) part.push(loom_test::chunk_gradient(k, n).data());
    REQUIRE(part.subtrees() == 1);
    t.push(part.subtree(0), node.leaves);
  }
  std::vector<float> root(n);
  REQUIRE(t.fold(root.data()));
  CHECK(root == ref);
  // Abandoned (after a recovery): empty, and usable again with fresh memory.
  t.reset(n);
  t.push(root.data());
  const float* before = t.subtree(0);
  t.abandon();
  CHECK(t.empty());
  t.reset(n);
  t.push(loom_test::chunk_gradient(0, n).data());
  CHECK(t.subtree(0) != before);
  CHECK(std::vector<float>(t.subtree(0), t.subtree(0) + n) == loom_test::chunk_gradient(0, n));
  // Not aligned: chunk 2 cannot start a subtree of 4.
  t.reset(n, 2);
  CHECK_THROWS_WITH(t.push(root.data(), 4), Catch::Contains("expected an aligned subtree of a power-of-two number of "
                                                            "chunks at chunk 2, found 4 chunks"));
}

namespace {
// A symbolic gradient: the chunks [first, last) it sums. Adding two records the tree node
// (first, middle, last) that addition computes, so a test sees every node and who adds it.
struct span_sum {
  std::uint32_t first = 0, last = 0;
};
std::mutex added_mutex;
std::vector<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>>* added = nullptr;
span_sum operator+(span_sum a, span_sum b) {
  std::lock_guard lock(added_mutex);
  if (added) added->emplace_back(a.first, a.last, b.last);
  return {a.first, a.last == b.first ? b.last : 0xffffffffu};  // a gap or an overlap shows as last = ~0
}
// The canonical tree's additions over chunks [first, last) of [0, k): (first, middle, last) for
// every node with two present children.
void canonical(std::size_t first, std::size_t size, std::size_t k,
               std::vector<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>>& out) {
  if (size == 1 || first + size / 2 >= k) {
    if (size > 1) canonical(first, size / 2, k, out);
    return;
  }
  canonical(first, size / 2, k, out);
  canonical(first + size / 2, size / 2, k, out);
  out.emplace_back(first, first + size / 2, std::min(first + size, k));
}
}  // namespace

TEST_CASE("On 1 to 8 ranks the ranks' subtrees and their range owners' additions are the canonical tree's nodes, each once",
          "[parallel][deterministic]") {
  // What chunk_exchange computes for one value of the owner's range: each rank's chunks into a
  // gradient_tree from its first chunk, then every rank's subtrees in chunk order into the
  // owner's tree, folded.
  std::vector<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>> log;
  added = &log;
  for (std::size_t batch : {64, 100, 112, 160}) {
    const auto chunk = std::size_t{16};
    for (std::size_t ranks = 1; ranks <= 8; ++ranks) {
      if ((batch + chunk - 1) / chunk < ranks) continue;
      const auto p = loom::chunk_plan::make(batch, chunk, ranks);
      for (std::size_t n : {batch, batch - 1, std::size_t{40}, std::size_t{16}, std::size_t{1}}) {
        INFO("batch " << batch << ", " << ranks << " ranks, a global batch of " << n);
        log.clear();
        const std::size_t k = p.chunks_in(n);
        std::vector<loom::gradient_tree<span_sum, loom::cpu>> rank_trees(ranks);
        loom::gradient_tree<span_sum, loom::cpu> owner;
        owner.reset(1);
        for (std::size_t r = 0; r < ranks; ++r) {
          const auto [f, l] = p.chunks_of(r, n);
          rank_trees[r].reset(1, f);
          for (std::size_t c = f; c < l; ++c) {
            const span_sum leaf{static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c + 1)};
            rank_trees[r].push(&leaf);
          }
          const auto want = loom::aligned_subtrees(f, l);
          REQUIRE(rank_trees[r].subtrees() == want.size());
          for (std::size_t i = 0; i < want.size(); ++i) {
            const span_sum s = *rank_trees[r].subtree(i);
            CHECK(s.first == want[i].first);
            CHECK(s.last == want[i].first + want[i].leaves);
            owner.push(rank_trees[r].subtree(i), want[i].leaves);
          }
        }
        span_sum root;
        REQUIRE(owner.fold(&root));
        CHECK(root.first == 0);
        CHECK(root.last == k);
        std::vector<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>> want;
        canonical(0, std::bit_ceil(k), k, want);
        std::sort(log.begin(), log.end());
        std::sort(want.begin(), want.end());
        CHECK(log == want);  // every node of the canonical tree, each added exactly once
      }
    }
  }
  added = nullptr;
}

TEST_CASE("On 1 to 8 local ranks the exchange gives every rank the bits of one rank's tree, full batches and tails",
          "[parallel][deterministic]") {
  // One exchange and one tree per rank, reused across world sizes and plans: nothing of a
  // world size stays behind (prepare_fit may plan again for fewer ranks).
  std::vector<loom::chunk_exchange<float, loom::cpu>> ex(8);
  std::vector<loom::gradient_tree<float, loom::cpu>> mine(8);
  for (std::size_t n : {std::size_t{1000}, std::size_t{5}}) {  // 5 values: some ranks own an empty range
    for (std::size_t ranks = 1; ranks <= 8; ++ranks) {
      for (std::size_t batch : {64, 112, 128}) {
        if (batch / 16 < ranks) continue;
        const auto p = loom::chunk_plan::make(batch, 16, ranks);
        for (std::size_t global_n : {batch, std::size_t{40}, std::size_t{16}, batch - 3}) {
          const std::size_t k = p.chunks_in(global_n);
          const auto ref = loom_test::one_rank_root(k, n);
          if (k >= 4 && n > 5) REQUIRE(ref != loom_test::running_sum(k, n));  // the order shows
          std::vector<std::vector<float>> got(ranks);
          std::vector<double> sent(ranks);
          loom::local_world(static_cast<int>(ranks)).run([&](loom::local_comm& c) {
            const auto r = static_cast<std::size_t>(c.rank());
            got[r] = loom_test::exchanged(c, p, global_n, n, mine[r], ex[r], &sent[r]);
          });
          INFO(n << " values, " << ranks << " ranks, batch " << batch << ", a global batch of " << global_n);
          for (std::size_t r = 0; r < ranks; ++r) {
            INFO("rank " << r);
            CHECK(got[r] == ref);
            // (N - 1) / N n per subtree held, and the finished range to the others.
            const auto [f, l] = p.chunks_of(r, global_n);
            const std::size_t own = (r + 1) * n / ranks - r * n / ranks;
            const double want = double(loom::aligned_subtrees(f, l).size() * (n - own) + (ranks - 1) * own) * 4;
            CHECK(sent[r] == want);
          }
        }
      }
    }
  }
  // A plan for another world size than the communicator's is refused.
  const auto p4 = loom::chunk_plan::make(64, 16, 4);
  std::vector<std::string> errors(3);
  loom::local_world(3).run([&](loom::local_comm& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    try {
      loom_test::exchanged(c, p4, 64, 10, mine[r], ex[r]);
    } catch (const loom::invalid_argument& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors)
    CHECK_THAT(e, Catch::Contains("the plan is for 4 ranks, the communicator has 3: call prepare_fit again"));
}

TEMPLATE_TEST_CASE("In deterministic mode N local ranks with global batch B end bitwise where 1 rank does, after 50 steps",
                   "[parallel][deterministic]", mlp, cnn) {
  const auto o = chunked(50, 64, 16);
  const auto ref = alone<TestType>(train_set(), o);
  // data_parallel on one rank runs the same code as single_process.
  CHECK(on_ranks<TestType>(1, train_set(), o) == ref);
  for (int ranks : {2, 3, 4}) {
    const auto dp = on_ranks<TestType>(ranks, train_set(), o);
    const double d = relative_distance(dp, ref);
    std::printf("deterministic mode, %s, %d local ranks, 50 steps of 64 in chunks of 16: relative L2 distance to 1 rank %.3g\n",
                TestType::parameter_count == mlp::parameter_count ? "mlp" : "cnn", ranks, d);
    INFO(ranks << " ranks: relative distance " << d);
    CHECK(d <= 1e-5);
    CHECK(dp == ref);  // bitwise
  }
}

TEST_CASE("In deterministic mode 5, 6 and 7 local ranks end bitwise where 1 rank does, with uneven shares",
          "[parallel][deterministic]") {
  // 112 = 7 chunks of 16: 2, 2, 1, 1, 1 on 5 ranks, 2, 1, ... on 6, 1 each on 7; 3200 = 28 x 112
  // + 64: each epoch ends with 4 chunks, the last ranks without samples. 30 steps cross it.
  const auto o = chunked(30, 112, 16);
  const auto ref = alone<mlp>(train_set(), o);
  for (int ranks : {5, 6, 7}) {
    INFO(ranks << " ranks");
    CHECK(on_ranks<mlp>(ranks, train_set(), o) == ref);
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
    for (int ranks : {2, 3, 4}) {
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
  // On 3 ranks, 3 micro-batches of 64 (4 chunks, 2, 1 and 1 per rank) against 192 in one step.
  const auto ref192 = alone<mlp>(train_set(), chunked(10, 192, 16));
  CHECK(on_ranks<mlp>(3, train_set(), chunked(10, 64, 16, 3)) == ref192);
}

TEST_CASE("Deterministic mode with fewer chunks than ranks stops every rank with a message naming batch, chunk, ranks "
          "and what works",
          "[parallel][deterministic]") {
  std::mutex m;
  std::vector<std::string> messages;
  loom::local_world(3).run([&](loom::local_comm& c) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, local_dp> t{c, momentum, {.seed = 1, .threads = 1}};
    try {
      t.fit(train_set(), chunked(5, 64, 32));
    } catch (const loom::invalid_argument& e) {
      std::lock_guard lock(m);
      messages.push_back(e.what());
    }
  });
  REQUIRE(messages.size() == 3);
  for (const auto& msg : messages)
    CHECK_THAT(msg, Catch::Contains("deterministic_chunk=32 with batch=64 on 3 ranks: a full batch makes 2 chunks of "
                                    "at most 32 samples, which leaves 1 rank without samples in every step: expected "
                                    "at least one chunk per rank; use a chunk of at most 21 samples"));
}
