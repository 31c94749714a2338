// SPDX-License-Identifier: Apache-2.0
// The shard map (loom/parallel/shard_map.hpp): what each rank holds of the whole model under
// every policy. Compile-time blocks checked with static_assert (data_parallel: everything;
// pipeline: the stage partition; tensor: the slices, covering the whole model once); at run
// time, over loom::local_comm, every engine's shard() places its rank's own parameters where
// gather_parameters() puts them, for every policy and both hybrids.

#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <vector>

#include "common.hpp"
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"
#include "rank_results.hpp"

using namespace loom_test;

namespace {

using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu, loom::linear<10>>;
// A small one for exhaustive compile-time coverage: a row_parallel first (strided blocks), a
// column_parallel after it, a replicated layer in between, and activations without parameters.
using small_tp = loom::network<loom::input<12>, loom::row_parallel<loom::linear<8>>, loom::tanh, loom::linear<6>,
                               loom::column_parallel<loom::linear<8>>, loom::relu, loom::linear<4>>;

/// How often the blocks of every slice 0 .. Width-1 cover each value of the whole model, a
/// shared block counted once (from slice 0, as shard_map::writes does).
template <class Network, std::size_t Width, std::size_t... S>
constexpr std::array<int, Network::parameter_count> coverage(std::index_sequence<S...>) {
  using layout = loom::tensor_parallel_layout<Network, Width>;
  std::array<int, Network::parameter_count> hits{};
  auto mark = [&](const auto& pieces, std::size_t slice) {
    for (const loom::shard_piece& p : pieces) {
      if (p.shared && slice != 0) continue;
      for (std::size_t i = 0; i < p.rows; ++i)
        for (std::size_t k = 0; k < p.count; ++k) ++hits[p.whole_offset + i * p.whole_stride + k];
    }
  };
  (mark(loom::shards::slice<layout, S>, S), ...);
  return hits;
}
template <class Network, std::size_t Width>
constexpr bool covers_once() {
  for (int h : coverage<Network, Width>(std::make_index_sequence<Width>{}))
    if (h != 1) return false;
  return true;
}
/// Whether every slice's blocks fill its own buffer exactly (each local value once).
template <class Network, std::size_t Width, std::size_t Slice>
constexpr bool fills_local_once() {
  using layout = loom::tensor_parallel_layout<Network, Width>;
  std::array<int, layout::rank_network::parameter_count> hits{};
  for (const loom::shard_piece& p : loom::shards::slice<layout, Slice>)
    for (std::size_t i = 0; i < p.rows; ++i)
      for (std::size_t k = 0; k < p.count; ++k) ++hits[p.local_offset + i * p.local_stride + k];
  for (int h : hits)
    if (h != 1) return false;
  return true;
}

// ---- data_parallel (and single_process): every rank holds the whole model in one block ----
static_assert(loom::shards::whole<mlp>.size() == 1);
static_assert(loom::shards::whole<mlp>[0] == loom::shard_piece{.whole_offset = 0, .local_offset = 0, .count = 235'146});

// ---- pipeline: stage s holds the stage partition's range ------------------------------------
using part2 = loom::stage_partition<mlp, loom::pipeline<2>>;
static_assert(loom::shards::stage<part2, 0>[0].whole_offset == 0);
static_assert(loom::shards::stage<part2, 0>[0].count == part2::parameter_counts[0]);
static_assert(loom::shards::stage<part2, 1>[0].whole_offset == part2::parameter_offsets[1]);
static_assert(loom::shards::stage<part2, 1>[0].count == part2::parameter_counts[1]);
static_assert(loom::shards::stage<part2, 0>[0].count + loom::shards::stage<part2, 1>[0].count == mlp::parameter_count);
using part3 = loom::stage_partition<cnn, loom::pipeline<3>>;
static_assert(loom::shards::stage<part3, 2>[0].whole_offset + loom::shards::stage<part3, 2>[0].count == cnn::parameter_count);
static_assert(loom::shards::stage<part3, 1>[0].whole_offset ==
              loom::shards::stage<part3, 0>[0].whole_offset + loom::shards::stage<part3, 0>[0].count);

// ---- tensor: the slices cover the whole model once, and each fills its own buffer ----------
using layout2 = loom::tensor_parallel_layout<tp_mlp, 2>;
// Column W (256, 784): slice 1 holds rows 128..255, one block; its b entries 128..255.
static_assert(loom::shards::slice<layout2, 1>[0] ==
              loom::shard_piece{.whole_offset = 128 * 784, .local_offset = 0, .count = 128 * 784});
static_assert(loom::shards::slice<layout2, 1>[1] ==
              loom::shard_piece{.whole_offset = 256 * 784 + 128, .local_offset = 128 * 784, .count = 128});
// Row W (128, 256): slice 1 holds columns 128..255 of each of the 128 rows; b whole and shared.
static_assert(loom::shards::slice<layout2, 1>[2] ==
              loom::shard_piece{.whole_offset = tp_mlp::parameter_offsets[2] + 128, .local_offset = 128 * 784 + 128,
                                .count = 128, .rows = 128, .whole_stride = 256, .local_stride = 128});
static_assert(loom::shards::slice<layout2, 1>[3].shared && loom::shards::slice<layout2, 1>[3].count == 128);
// The last linear is replicated.
static_assert(loom::shards::slice<layout2, 0>[4].shared &&
              loom::shards::slice<layout2, 0>[4].count == tp_mlp::parameter_counts[4]);
static_assert(covers_once<small_tp, 2>());
static_assert(covers_once<small_tp, 4>());
static_assert(fills_local_once<small_tp, 2, 1>());
static_assert(fills_local_once<small_tp, 4, 3>());
static_assert(loom::shards::local_size(loom::shards::slice<layout2, 0>) ==
              loom::tensor_parallel_network<tp_mlp, 2>::parameter_count);

// ---- every engine gives the same blocks, hybrids included ----------------------------------
using lcomm = loom::local_comm;
template <class Net, class Policy>
using engine_of = typename loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy>::engine_type;
static_assert(engine_of<mlp, loom::single_process>::pieces_of<0> == loom::shards::whole<mlp>);
static_assert(engine_of<mlp, loom::data_parallel<lcomm>>::pieces_of<0> == loom::shards::whole<mlp>);
static_assert(engine_of<mlp, loom::model_parallel<loom::pipeline<2>, lcomm>>::pieces_of<1> == loom::shards::stage<part2, 1>);
static_assert(engine_of<mlp, loom::hybrid<loom::data_parallel<lcomm>, loom::pipeline<2>>>::pieces_of<0> ==
              loom::shards::stage<part2, 0>);
static_assert(engine_of<mlp, loom::hybrid<loom::data_parallel<lcomm>, loom::pipeline<2>>>::pieces_of<1> ==
              loom::shards::stage<part2, 1>);
static_assert(engine_of<tp_mlp, loom::model_parallel<loom::tensor_parallel<2>, lcomm>>::pieces_of<1> ==
              loom::shards::slice<layout2, 1>);
static_assert(engine_of<tp_mlp, loom::hybrid<loom::data_parallel<lcomm>, loom::tensor_parallel<2>>>::pieces_of<0> ==
              loom::shards::slice<layout2, 0>);
static_assert(engine_of<tp_mlp, loom::hybrid<loom::data_parallel<lcomm>, loom::tensor_parallel<2>>>::pieces_of<1> ==
              loom::shards::slice<layout2, 1>);

/// Each rank's shard() and its own parameters, placed into the whole layout, must agree with
/// gather_parameters() wherever the rank holds them; and the ranks together hold everything.
template <class Net, class Policy>
void check_shards_place_parameters(int ranks, int expected_replicas, int expected_stages, int expected_slices) {
  struct rank_shard {
    loom::shard_map map;
    std::vector<float> local, back;    // its own parameters; them placed into the whole and read back
    std::vector<float> placed, whole;  // its own placed into the whole layout; gather_parameters()
    std::vector<char> held;            // which values of the whole layout it holds
  };
  const auto found = loom::testing::on_local_ranks(ranks, [&](loom::local_comm& c) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{c, {.lr = 0.02f}, {.seed = 3, .threads = 1}};
    t.fit(train_set(), steps(2, 32));
    rank_shard s;
    s.map = t.shard();
    const loom::shard_map& m = s.map;
    if constexpr (requires { t.model().copy_parameters_to_host(); }) {
      s.local = t.model().copy_parameters_to_host();
    } else {
      s.local = std::visit([](auto& st) { return st.copy_parameters_to_host(); }, t.model());
    }
    if (s.local.size() == m.local_count) {  // else the REQUIRE below stops the test
      s.placed.assign(m.whole_count, -1e30f);
      loom::copy_to_whole(m, s.local.data(), s.placed.data());
      s.held.assign(m.whole_count, 0);
      for (const auto& p : m.pieces)
        for (std::size_t i = 0; i < p.rows; ++i)
          for (std::size_t k = 0; k < p.count; ++k) s.held[p.whole_offset + i * p.whole_stride + k] = 1;
      // Back again: copy_from_whole is its inverse on this rank's values.
      s.back.assign(m.local_count, 0.0f);
      loom::copy_from_whole(m, s.placed.data(), s.back.data());
    }
    s.whole = t.gather_parameters();
    return s;
  });
  std::vector<int> writers(Net::parameter_count, 0);
  for (std::size_t r = 0; r < found.size(); ++r) {
    const rank_shard& s = found[r];
    const auto& m = s.map;
    INFO("rank " << r);
    REQUIRE(s.local.size() == m.local_count);
    CHECK(s.back == s.local);
    CHECK(m.whole_count == Net::parameter_count);
    CHECK(m.replicas == expected_replicas);
    CHECK(m.stages == expected_stages);
    CHECK(m.slices == expected_slices);
    for (std::size_t i = 0; i < Net::parameter_count; ++i)
      if (s.held[i]) REQUIRE(s.placed[i] == found[0].whole[i]);
    for (const auto& p : m.pieces)
      if (m.writes(p))
        for (std::size_t i = 0; i < p.rows; ++i)
          for (std::size_t k = 0; k < p.count; ++k) ++writers[p.whole_offset + i * p.whole_stride + k];
  }
  // Written once each, by the ranks shard_map::writes names: a checkpoint holds the whole model.
  for (std::size_t i = 0; i < Net::parameter_count; ++i) REQUIRE(writers[i] == 1);
}

}  // namespace

TEST_CASE("Each policy's shard map places the rank's parameters where the whole model has them", "[parallel][shard]") {
  using lc = loom::local_comm;
  SECTION("single process") {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 3, .threads = 1}};
    const loom::shard_map m = t.shard();
    CHECK(m.replicas == 1);
    CHECK(m.pieces.size() == 1);
    CHECK(m.local_count == mlp::parameter_count);
  }
  SECTION("data_parallel over 2") { check_shards_place_parameters<mlp, loom::data_parallel<lc>>(2, 2, 1, 1); }
  SECTION("pipeline of 2 stages") {
    check_shards_place_parameters<mlp, loom::model_parallel<loom::pipeline<2>, lc>>(2, 1, 2, 1);
  }
  SECTION("pipeline of 3 stages (cnn)") {
    check_shards_place_parameters<cnn, loom::model_parallel<loom::pipeline<3>, lc>>(3, 1, 3, 1);
  }
  SECTION("tensor parallel over 2") {
    check_shards_place_parameters<tp_mlp, loom::model_parallel<loom::tensor_parallel<2>, lc>>(2, 1, 1, 2);
  }
  SECTION("hybrid: 2 replicas of a 2-stage pipeline") {
    check_shards_place_parameters<mlp, loom::hybrid<loom::data_parallel<lc>, loom::pipeline<2>>>(4, 2, 2, 1);
  }
  SECTION("hybrid: 2 replicas of a 2-way tensor split") {
    check_shards_place_parameters<tp_mlp, loom::hybrid<loom::data_parallel<lc>, loom::tensor_parallel<2>>>(4, 2, 1, 2);
  }
}

TEST_CASE("compose: a slice's blocks cut by ZeRO's ranges map every value of the shard where the slice has it",
          "[parallel][shard]") {
  // small_tp's slice 1 of 2: a row_parallel weight's column block (strided rows), its shared
  // bias, a replicated layer, a column_parallel block. Cut into every split of its buffer into
  // three ranges (the shards of 3 replicas, each range placed in a buffer of its own), the
  // composed blocks must put each value of each shard where the slice's blocks put it in the
  // whole layout — value by value — and keep `shared`.
  using layout = loom::tensor_parallel_layout<small_tp, 2>;
  constexpr auto slice = loom::shards::slice<layout, 1>;
  constexpr std::size_t n = loom::shards::local_size(slice);
  // The slice's own map: local index -> whole index, and whether shared.
  std::vector<std::size_t> whole_of(n);
  std::vector<bool> shared_of(n);
  for (const loom::shard_piece& p : slice)
    for (std::size_t i = 0; i < p.rows; ++i)
      for (std::size_t k = 0; k < p.count; ++k) {
        whole_of[p.local_offset + i * p.local_stride + k] = p.whole_offset + i * p.whole_stride + k;
        shared_of[p.local_offset + i * p.local_stride + k] = p.shared;
      }
  std::size_t cuts = 0, wrong = 0, pieces = 0;
  for (std::size_t a = 0; a <= n; ++a)
    for (std::size_t b = a; b <= n; b += 3) {
      // The middle range [a, b) as one ZeRO shard of two slices of buckets: [a, m) and [m, b).
      const std::size_t m = a + (b - a) / 3;
      std::vector<loom::shard_piece> inner;
      if (m > a) inner.push_back({.whole_offset = a, .local_offset = 0, .count = m - a});
      if (b > m) inner.push_back({.whole_offset = m, .local_offset = m - a, .count = b - m});
      const auto out = loom::compose(slice, inner);
      std::vector<int> seen(b - a, 0);
      for (const loom::shard_piece& p : out) {
        ++pieces;
        for (std::size_t i = 0; i < p.rows; ++i)
          for (std::size_t k = 0; k < p.count; ++k) {
            const std::size_t at = p.local_offset + i * p.local_stride + k;
            if (at >= b - a) {
              ++wrong;
              continue;
            }
            ++seen[at];
            wrong += whole_of[a + at] != p.whole_offset + i * p.whole_stride + k;
            wrong += shared_of[a + at] != p.shared;
          }
      }
      for (int s : seen) wrong += s != 1;
      ++cuts;
    }
  INFO(cuts << " cuts, " << pieces << " composed blocks");
  CHECK(wrong == 0);
  CHECK(cuts > 100);
}
