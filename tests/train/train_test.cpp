// SPDX-License-Identifier: Apache-2.0
// The trainer end to end on the real Fashion-MNIST: it learns, it repeats itself exactly, and
// it refuses bad arguments with a message.

#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>

#include "loom/loom.hpp"

namespace {

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;
using small_cnn = loom::network<loom::input<1, 28, 28>, loom::conv2d<8, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                                loom::flatten, loom::linear<10>>;

const loom::data::fashion_mnist_set& train_set() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(2000);
  return s;
}
const loom::data::fashion_mnist_set& test_set() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::test).first(1000);
  return s;
}

loom::fit_options quiet(std::size_t epochs, std::size_t batch = 64) {
  loom::fit_options o;
  o.epochs = epochs;
  o.batch = batch;
  o.progress = nullptr;
  return o;
}

}  // namespace

TEST_CASE("The mlp trained on 2,000 images for 2 epochs reaches 75% test accuracy on 1,000", "[train]") {
  // 64 steps is a small budget and the result varies with the seed: measured over seeds 1-8,
  // Adam (lr 1e-3, batch 64) gives 0.718-0.787 here, SGD (lr 0.02, momentum 0.9) 0.669-0.768,
  // and PyTorch 1.13 with that SGD setting and the same initialisation 0.637-0.791. Runs are
  // bitwise reproducible, so this case is deterministic: seed 1 with Adam reaches 0.765.
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam> t{{.lr = 1e-3f}, {.seed = 1, .threads = 2}};
  const auto before = t.evaluate(test_set());
  const auto fit = t.fit(train_set(), quiet(2));
  const auto after = t.evaluate(test_set());
  INFO("accuracy before " << before.accuracy << ", after " << after.accuracy << ", train loss " << fit.train_loss);
  CHECK(fit.epochs == 2);
  CHECK(fit.samples == 4000);
  CHECK(fit.steps == 2 * 32);  // 2000 / 64 = 31 full batches and a tail of 16
  CHECK(after.samples == 1000);
  CHECK(after.accuracy >= 0.75);
  CHECK(after.loss < before.loss);
}

TEST_CASE("The same seed gives bitwise identical parameters; another seed does not", "[train]") {
  auto run = [](std::uint64_t seed) {
    loom::trainer<small_cnn, loom::softmax_cross_entropy, loom::adam> t{{.lr = 1e-3f}, {.seed = seed, .threads = 2}};
    auto o = quiet(1, 50);
    o.max_steps = 15;
    t.fit(train_set(), o);
    return t.model().parameters_l2();
  };
  const double a = run(3), b = run(3), c = run(4);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("max_steps stops training mid-epoch and counts only the steps run", "[train]") {
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.01f}, {.seed = 1, .threads = 1}};
  auto o = quiet(3, 100);
  o.max_steps = 7;
  const auto r = t.fit(train_set(), o);
  CHECK(r.steps == 7);
  CHECK(r.samples == 700);
  CHECK(t.steps() == 7);
  CHECK(r.samples_per_s() > 0);
}

TEST_CASE("A learning-rate schedule and gradient clipping are applied", "[train]") {
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.05f}, {.seed = 2, .threads = 1}};
  auto o = quiet(1, 100);
  std::vector<float> seen;
  o.schedule = [&](std::size_t step, float base) {
    seen.push_back(base / static_cast<float>(step + 1));
    return seen.back();
  };
  o.clip_grad_norm = 1.0;
  o.max_steps = 3;
  t.fit(train_set(), o);
  REQUIRE(seen.size() == 3);
  CHECK(seen[2] == Approx(0.05f / 3));
  // Clipping left the last step's gradient at norm <= 1 (+ PyTorch's 1e-6 slack).
  double norm = 0;
  for (float g : t.model().gradients()) norm += double(g) * g;
  CHECK(std::sqrt(norm) <= 1.0 + 1e-5);
}

TEST_CASE("Progress goes to the given stream as plain lines when it is not a terminal", "[train]") {
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.01f}, {.seed = 1, .threads = 1}};
  std::ostringstream out;
  auto o = quiet(1, 500);
  o.progress = &out;
  t.fit(train_set(), o);
  CHECK_THAT(out.str(), Catch::Contains("epoch 1/1 step 4/4 loss"));
  CHECK(out.str().find('\r') == std::string::npos);
}

TEST_CASE("fit and evaluate reject a zero batch with a message", "[train]") {
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.01f}, {.seed = 1, .threads = 1}};
  CHECK_THROWS_WITH(t.fit(train_set(), quiet(1, 0)), Catch::Contains("batch must be at least 1"));
  CHECK_THROWS_AS(t.evaluate(test_set(), 0), loom::invalid_argument);
}

TEST_CASE("Evaluation is deterministic and does not change the parameters", "[train]") {
  loom::trainer<small_cnn, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.01f}, {.seed = 5, .threads = 2}};
  const double l2 = t.model().parameters_l2();
  const auto a = t.evaluate(test_set(), 64);
  const auto b = t.evaluate(test_set(), 1000);
  CHECK(t.model().parameters_l2() == l2);
  CHECK(a.accuracy == b.accuracy);
  CHECK(a.loss == Approx(b.loss).epsilon(1e-5));
}
