// SPDX-License-Identifier: Apache-2.0
// trainer_options::math = math_mode::bf16 end to end: the master weights, gradients and
// optimizer stay float and the mlp learns as well as in fp32. Every case needs bf16 on this CPU:
// the binary (test_train_bf16) reports Skipped where it is missing. What a CPU without bf16
// gets instead, an error that says what to do, is bf16_refused_test.cpp.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace {

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;

const loom::data::fashion_mnist_set& train_images() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(6400);
  return s;
}
const loom::data::fashion_mnist_set& test_images() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::test).first(1000);
  return s;
}

loom::fit_options steps(std::size_t epochs, std::size_t max_steps = 0) {
  loom::fit_options o;
  o.epochs = epochs;
  o.batch = 64;
  o.max_steps = max_steps;
  o.progress = nullptr;
  return o;
}

}  // namespace

TEST_CASE("bf16 training keeps float master weights: an update below bf16's resolution still moves them",
          "[train][bf16]") {
  REQUIRE(loom::cpu::supports(loom::math_mode::bf16));
  const float lr = 1e-4f;
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = lr},
                                                                {.seed = 3, .threads = 2, .math = loom::math_mode::bf16}};
  const auto p0 = t.model().copy_parameters_to_host();
  t.fit(train_images(), steps(1, 1));
  REQUIRE(t.steps() == 1);
  const auto p1 = t.model().copy_parameters_to_host();
  const auto g = t.model().copy_gradients_to_host();
  std::size_t moved = 0, moved_below_bf16 = 0, gradients_finer_than_bf16 = 0, updates_exact = 0, nonzero = 0;
  for (std::size_t i = 0; i < p0.size(); ++i) {
    if (g[i] == 0) continue;
    ++nonzero;
    if (p1[i] != p0[i]) ++moved;
    // The change is invisible in bf16: the bf16-rounded weight is the same before and after.
    if (p1[i] != p0[i] && loom::detail::round_to_bf16(p1[i]) == loom::detail::round_to_bf16(p0[i])) ++moved_below_bf16;
    if (loom::detail::round_to_bf16(g[i]) != g[i]) ++gradients_finer_than_bf16;
    // Plain SGD: p1 = p0 - lr g, in float, to a rounding of p0's size.
    if (std::abs(p1[i] - (p0[i] - lr * g[i])) <= 1e-7f * std::abs(p0[i]) + 1e-12f) ++updates_exact;
  }
  INFO("parameters with a gradient " << nonzero << ", moved " << moved << ", moved below bf16 resolution "
                                     << moved_below_bf16 << ", gradients with more than bf16's bits "
                                     << gradients_finer_than_bf16 << ", p0 - lr g exactly " << updates_exact);
  CHECK(nonzero > p0.size() / 2);
  CHECK(moved > nonzero * 9 / 10);               // tiny updates are kept...
  CHECK(moved_below_bf16 > nonzero / 2);         // ...though most are too small for bf16 to see
  CHECK(gradients_finer_than_bf16 > nonzero / 2);  // the optimizer gets float gradients
  CHECK(updates_exact == nonzero);
}

TEST_CASE("The mlp trained 300 steps in bf16 reaches its fp32 test accuracy within 0.02", "[train][bf16]") {
  auto train = [](loom::math_mode m) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                  {.seed = 1, .threads = 2, .math = m}};
    const auto fit = t.fit(train_images(), steps(3));
    CHECK(fit.steps == 300);
    return std::pair{t.evaluate(test_images()), t.model().parameters_l2()};
  };
  const auto [fp32, l2_fp32] = train(loom::math_mode::fp32);
  const auto [bf16, l2_bf16] = train(loom::math_mode::bf16);
  INFO("test accuracy fp32 " << fp32.accuracy << " (loss " << fp32.loss << "), bf16 " << bf16.accuracy << " (loss "
                             << bf16.loss << ")");
  CHECK(fp32.accuracy > 0.75);
  CHECK(std::abs(bf16.accuracy - fp32.accuracy) <= 0.02);
  CHECK(std::abs(bf16.loss - fp32.loss) < 0.05);
  CHECK(l2_bf16 != l2_fp32);  // bf16 did run: the weights took another path
}

TEST_CASE("fp32 training is unchanged by a bf16 trainer before it in the same process, and bf16 differs",
          "[train][bf16]") {
  // Cached oneDNN primitives of both modes live side by side; fp32 must not pick up bf16 ones.
  auto l2_after = [](loom::math_mode m) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 5, .threads = 2, .math = m}};
    t.fit(train_images(), steps(1, 5));
    return t.model().parameters_l2();
  };
  const double a = l2_after(loom::math_mode::fp32);
  const double b = l2_after(loom::math_mode::bf16);
  const double c = l2_after(loom::math_mode::fp32);
  CHECK(a == c);
  CHECK(a != b);
}
