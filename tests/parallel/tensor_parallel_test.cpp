// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism over loom::local_comm (ranks as threads of this process): the sliced
// network's compile-time shapes, whole-network equivalence of column_parallel / row_parallel,
// the slices' initialisation, and training under model_parallel<tensor_parallel<T>> and
// hybrid<data_parallel, tensor_parallel<T>> against one process.

#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "common.hpp"
#include "loom/comm/local.hpp"
#include "loom/parallel/hybrid.hpp"

using namespace loom_test;

namespace {

using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu, loom::linear<10>>;
template <std::size_t T>
using tp_policy = loom::model_parallel<loom::tensor_parallel<T>, loom::local_comm>;
using hybrid_policy = loom::hybrid<loom::data_parallel<loom::local_comm>, loom::tensor_parallel<2>>;
using sgd_options = loom::sgd::options;
constexpr sgd_options sgd_opt{.lr = 0.02f, .momentum = 0.9f};

// ---- (e) the slices' compile-time shapes -----------------------------------------------------
using rank2 = loom::tensor_parallel_network<tp_mlp, 2>;
// Column: rows [r 128, (r+1) 128) of W (256, 784) and that half of b.
static_assert(rank2::parameter_counts[0] == 256 * 784 / 2 + 256 / 2);
static_assert(std::is_same_v<rank2::chain::output_of<0>, loom::shape<128>>);
// Row: columns [r 128, (r+1) 128) of W (128, 256) and the whole b (128).
static_assert(rank2::parameter_counts[2] == 128 * 256 / 2 + 128);
static_assert(std::is_same_v<rank2::chain::input_of<2>, loom::shape<128>>);
static_assert(std::is_same_v<rank2::chain::output_of<2>, loom::shape<128>>);
// The plain last layer is whole on every rank.
static_assert(rank2::parameter_counts[4] == tp_mlp::parameter_counts[4]);
// Run whole, the tensor-parallel mlp is the plain mlp.
static_assert(tp_mlp::parameter_counts == mlp::parameter_counts);
// A column_parallel not followed by a row_parallel gathers its whole output; a row_parallel
// without a column_parallel before it reads its slice of the whole input.
using unpaired = loom::network<loom::input<12>, loom::row_parallel<loom::linear<8>>, loom::tanh,
                               loom::column_parallel<loom::linear<6>>>;
using unpaired3 = loom::tensor_parallel_network<unpaired, 3>;
static_assert(unpaired3::parameter_counts[0] == 8 * 12 / 3 + 8);
static_assert(unpaired3::parameter_counts[2] == 6 * 8 / 3 + 6 / 3);
static_assert(std::is_same_v<unpaired3::output_shape, loom::shape<6>>);

struct run_result {
  std::vector<float> gathered;  // the whole model, Network's layout
  std::vector<float> local;     // this rank's slice
  double l2 = 0;
  loom::fit_result fit;
};

/// Trains Policy over `ranks` local ranks for n steps of batch (0 steps: just constructs);
/// returns each rank's result.
template <class Net, class Policy>
std::vector<run_result> train(int ranks, std::size_t n, std::size_t batch, loom::fit_options opts = steps(1, 64)) {
  std::vector<run_result> out(static_cast<std::size_t>(ranks));
  loom::local_world(ranks).run([&](loom::local_comm& c) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{c, sgd_opt, {.seed = 1, .threads = 1}};
    run_result& r = out[static_cast<std::size_t>(c.rank())];
    if (n > 0) {
      opts.max_steps = n;
      opts.batch = batch;
      r.fit = t.fit(train_set(), opts);
    }
    r.gathered = t.gather_parameters();
    r.local = t.model().copy_parameters_to_host();
    r.l2 = t.parameters_l2();
  });
  return out;
}

double l2_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("Run whole, column_parallel and row_parallel train exactly as linear", "[parallel][tensor]") {
  loom::trainer<tp_mlp, loom::softmax_cross_entropy, loom::sgd> t{sgd_opt, {.seed = 1, .threads = 1}};
  t.fit(train_set(), steps(5, 64));
  const auto p = t.gather_parameters();
  CHECK(p == reference<mlp>(5, 64));
  CHECK(t.parameters_l2() == t.model().parameters_l2());
}

TEST_CASE("The slices of a 2-way split initialise as the whole model, bit for bit", "[parallel][tensor]") {
  const auto whole = loom::model<mlp, float>(1).copy_parameters_to_host();
  const auto r = train<tp_mlp, tp_policy<2>>(2, 0, 0);
  for (const auto& rank : r) CHECK(rank.gathered == whole);
  CHECK(r[0].local != r[1].local);  // each rank holds different values
  CHECK(r[0].local.size() == loom::tensor_parallel_network<tp_mlp, 2>::parameter_count);
}

TEST_CASE("T ranks of tensor parallelism end where one process does after 20 steps of 64", "[parallel][tensor]") {
  const auto ref = reference<mlp>(20, 64);
  const double ref_l2 = l2_of(ref);
  auto check_run = [&](const std::vector<run_result>& r, int ranks) {
    INFO(ranks << " ranks");
    for (const auto& rank : r) {
      CHECK(rank.gathered == r[0].gathered);  // every rank gathers the same whole model
      CHECK(std::abs(rank.l2 - ref_l2) <= 1e-5 * ref_l2);
      CHECK(rank.fit.ranks == ranks);
      CHECK(rank.fit.figures.size() == static_cast<std::size_t>(ranks));
      CHECK(rank.fit.samples == 20 * 64);  // the tensor group's ranks count their samples once
    }
    const double d = relative_distance(r[0].gathered, ref);
    CHECK(d <= 1e-5);
    CHECK(d > 0);  // the split sums round differently: this really ran split
    CHECK(r[0].fit.figures[0].bytes_sent > 0);
  };
  check_run(train<tp_mlp, tp_policy<2>>(2, 20, 64), 2);
  check_run(train<tp_mlp, tp_policy<4>>(4, 20, 64), 4);
}

TEST_CASE("hybrid data x tensor parallelism, 2 x 2 local ranks, ends where one process does", "[parallel][tensor]") {
  const auto ref = reference<mlp>(20, 64);
  const auto r = train<tp_mlp, hybrid_policy>(4, 20, 64);
  // Ranks 0 and 2 hold slice 0 of replicas 0 and 1: identical; 0 and 1 are different slices.
  CHECK(r[0].local == r[2].local);
  CHECK(r[1].local == r[3].local);
  CHECK(r[0].local != r[1].local);
  for (const auto& rank : r) {
    CHECK(rank.gathered == r[0].gathered);
    CHECK(rank.fit.samples == 20 * 64);
  }
  CHECK(relative_distance(r[0].gathered, ref) <= 1e-5);
}

TEST_CASE("Gradient clipping and evaluation under tensor parallelism match one process", "[parallel][tensor]") {
  auto opts = steps(10, 64);
  opts.clip_grad_norm = 0.5;  // small enough to clip every step of this run
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> one{sgd_opt, {.seed = 1, .threads = 1}};
  one.fit(train_set(), opts);
  const auto ref = one.gather_parameters();
  const auto ref_eval = one.evaluate(train_set(), 500);
  const auto unclipped = reference<mlp>(10, 64);
  REQUIRE(relative_distance(unclipped, ref) > 1e-3);  // clipping changed the run

  std::vector<loom::eval_result> evals(2);
  std::vector<std::vector<float>> gathered(2);
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<tp_mlp, loom::softmax_cross_entropy, loom::sgd, tp_policy<2>> t{c, sgd_opt, {.seed = 1, .threads = 1}};
    t.fit(train_set(), opts);
    gathered[static_cast<std::size_t>(c.rank())] = t.gather_parameters();
    evals[static_cast<std::size_t>(c.rank())] = t.evaluate(train_set(), 500);
  });
  CHECK(relative_distance(gathered[0], ref) <= 1e-5);
  for (const auto& e : evals) {
    CHECK(e.samples == ref_eval.samples);
    CHECK(std::abs(e.loss - ref_eval.loss) <= 1e-4 * ref_eval.loss);
  }
}

TEST_CASE("A communicator of the wrong size is refused on every rank, naming both sizes", "[parallel][tensor]") {
  std::mutex m;
  std::vector<std::string> caught;
  loom::local_world(3).run([&](loom::local_comm& c) {
    try {
      loom::trainer<tp_mlp, loom::softmax_cross_entropy, loom::sgd, tp_policy<2>> t{c, sgd_opt, {.seed = 1, .threads = 1}};
    } catch (const loom::invalid_argument& e) {
      std::lock_guard<std::mutex> lock(m);
      caught.emplace_back(e.what());
    }
  });
  REQUIRE(caught.size() == 3);
  CHECK_THAT(caught[0], Catch::Contains("has 3 ranks") && Catch::Contains("exactly 2"));
}

TEST_CASE("A rank given a different job stops every rank with the differing field", "[parallel][tensor]") {
  std::mutex m;
  std::vector<std::string> caught;
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      loom::trainer<tp_mlp, loom::softmax_cross_entropy, loom::sgd, tp_policy<2>> t{
          c, sgd_opt, {.seed = c.rank() == 0 ? 1u : 2u, .threads = 1}};
    } catch (const loom::communication_error& e) {
      std::lock_guard<std::mutex> lock(m);
      caught.emplace_back(e.what());
    }
  });
  REQUIRE(caught.size() == 2);
  CHECK_THAT(caught[0], Catch::Contains("rank 1 differs from rank 0") && Catch::Contains("[seed=2] where rank 0 has [seed=1]"));
}

TEST_CASE("Gradient accumulation under tensor parallelism matches one process", "[parallel][tensor]") {
  // 10 optimizer steps of 2 micro-batches of 32: the slices' backward adds to their gradients.
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> one{sgd_opt, {.seed = 1, .threads = 1}};
  one.fit(train_set(), steps(10, 32, 2));
  const auto r = train<tp_mlp, tp_policy<2>>(2, 10, 32, steps(10, 32, 2));
  const double d = relative_distance(r[0].gathered, one.gather_parameters());
  CHECK(d <= 1e-5);
  CHECK(d > 0);
  CHECK(r[0].fit.steps == 10);
}

TEST_CASE("A row layer reading the whole input and a gathered column layer train as one process does",
          "[parallel][tensor]") {
  // The first layer is a row_parallel without a column before it (its input gradient is never
  // needed: no allreduce in backward), the last a column_parallel without a row after it (its
  // output is gathered before the loss).
  using unpaired_mlp = loom::network<loom::input<784>, loom::row_parallel<loom::linear<64>>, loom::relu,
                                     loom::column_parallel<loom::linear<10>>>;
  using plain = loom::network<loom::input<784>, loom::linear<64>, loom::relu, loom::linear<10>>;
  const auto ref = reference<plain>(20, 64);
  const auto r = train<unpaired_mlp, tp_policy<2>>(2, 20, 64);
  CHECK(r[0].gathered == r[1].gathered);
  const double d = relative_distance(r[0].gathered, ref);
  CHECK(d <= 1e-5);
  CHECK(d > 0);
}
