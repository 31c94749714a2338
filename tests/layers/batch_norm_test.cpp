// SPDX-License-Identifier: Apache-2.0
// loom::batch_norm against PyTorch's semantics, worked out by hand: training normalises with the
// batch's statistics and moves the running ones (unbiased variance, momentum 0.1) and counts
// the batch; evaluation normalises with the running ones; a zero-variance channel gives its
// bias; one value per channel in training is refused with PyTorch's sentence. float runs
// oneDNN (plain and blocked layouts, a following ReLU fused in), double loom's kernel bodies;
// statistics summed over a group (the synchronized batch norm hook) normalise two replicas of
// a batch as one replica of both.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "error_message.hpp"
#include "gradient_check.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/named.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"
#include "relative_error.hpp"
#include "two_threads.hpp"

#include <omp.h>

using namespace loom;
using loom::testing::relatively_equals;
using loom::testing::values_of;

namespace {

template <class T>
constexpr double tol = std::is_same_v<T, float> ? 2e-6 : 1e-12;

/// Sums, in place, as if every rank of a group of `ranks` held the same values.
struct same_on_every_rank final : process_group {
  int ranks = 2;
  int rank() const override { return 0; }
  int size() const override { return ranks; }
  void allreduce_sum(float* v, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) v[i] *= static_cast<float>(ranks);
  }
  void allreduce_sum(double* v, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) v[i] *= ranks;
  }
};

}  // namespace

TEMPLATE_TEST_CASE("batch_norm in training normalises each feature with the batch's statistics and moves the running ones",
                   "[layers][batch_norm][forward]", float, double) {
  using net = network<input<2>, batch_norm>;
  model<net, TestType> m(1);
  // weight (2, -1), bias (0.5, 0).
  const std::vector<TestType> p{2, -1, 0.5, 0};
  std::copy(p.begin(), p.end(), m.parameters().begin());
  // Feature 0 over the batch: 1, 2, 3, 4: mean 2.5, biased variance 1.25, unbiased 5/3.
  // Feature 1: 0, 0, 0, 8: mean 2, biased variance 12, unbiased 16.
  const std::vector<TestType> x{1, 0, 2, 0, 3, 0, 4, 8};
  const TestType* y = m.forward(run_context{}, x.data(), 4);
  const double s0 = 1 / std::sqrt(1.25 + 1e-5), s1 = 1 / std::sqrt(12 + 1e-5);
  CHECK_THAT(values_of(y, 8), relatively_equals<TestType>({2 * -1.5 * s0 + 0.5, -1 * -2 * s1, 2 * -0.5 * s0 + 0.5, -1 * -2 * s1,
                                                           2 * 0.5 * s0 + 0.5, -1 * -2 * s1, 2 * 1.5 * s0 + 0.5, -1 * 6 * s1},
                                                          tol<TestType>));
  // running_mean = 0.9 * 0 + 0.1 * mean; running_var = 0.9 * 1 + 0.1 * unbiased; one batch.
  const auto b = m.copy_buffers_to_host();
  REQUIRE(b.size() == 5);
  CHECK_THAT(values_of(b), relatively_equals<TestType>({0.25, 0.2, 0.9 + 0.1 * 5.0 / 3.0, 0.9 + 1.6, 1}, tol<TestType>));
  m.forward(run_context{}, x.data(), 4);
  const auto b2 = m.copy_buffers_to_host();
  CHECK_THAT(values_of(b2), relatively_equals<TestType>({0.25 * 0.9 + 0.25, 0.2 * 0.9 + 0.2,
                                                         (0.9 + 0.1 * 5.0 / 3.0) * 0.9 + 0.1 * 5.0 / 3.0, 2.5 * 0.9 + 1.6, 2},
                                                        tol<TestType>));
}

TEMPLATE_TEST_CASE("batch_norm on images normalises each channel over the batch and the image, in evaluation with the "
                   "running statistics",
                   "[layers][batch_norm][forward]", float, double) {
  using net = network<input<2, 1, 2>, batch_norm>;
  model<net, TestType> m(1);
  // Channel 0: 1, 3 (sample 0), 5, 7 (sample 1): mean 4, biased variance 5. Channel 1: 2 everywhere.
  const std::vector<TestType> x{1, 3, 2, 2, 5, 7, 2, 2};
  const TestType* y = m.forward(run_context{}, x.data(), 2);
  const double s = 1 / std::sqrt(5 + 1e-5);
  // A zero-variance channel normalises to 0 * weight + bias = 0 (bias 0): finite, eps keeps it so.
  CHECK_THAT(values_of(y, 8), relatively_equals<TestType>({-3 * s, -s, 0, 0, s, 3 * s, 0, 0}, tol<TestType>, 1e-12));
  // Evaluation: (x - running_mean) / sqrt(running_var + eps) * weight + bias, with running
  // statistics set by hand, weight (1, 2), bias (0, 1); a batch of 1 is fine.
  auto b = m.buffers();
  const std::vector<TestType> running{1, 2, 4, 0.25, 0};
  model<net, TestType>::copy_from_host(running.data(), running.size(), b.data());
  const std::vector<TestType> p{1, 2, 0, 1};
  std::copy(p.begin(), p.end(), m.parameters().begin());
  run_context eval;
  eval.training = false;
  const TestType* e = m.forward(eval, x.data(), 1);
  const double r0 = 1 / std::sqrt(4 + 1e-5);  // channel 1: (2 - 2) * 2 + 1
  CHECK_THAT(values_of(e, 4), relatively_equals<TestType>({0, 2 * r0, 1, 1}, tol<TestType>, 1e-12));
  CHECK(m.copy_buffers_to_host() == running);  // evaluation leaves them
}

TEMPLATE_TEST_CASE("batch_norm with one value per channel in training is refused as PyTorch refuses it",
                   "[layers][batch_norm][forward]", float, double) {
  model<network<input<3>, batch_norm>, TestType> m(1);
  const std::vector<TestType> x{1, 2, 3};
  const std::string msg = loom::testing::error_message<invalid_argument>([&] { m.forward(run_context{}, x.data(), 1); });
  CHECK_THAT(msg, Catch::Contains("loom::batch_norm at layer 0: expected more than 1 value per channel when training, got "
                                  "a batch of 1 sample with 1 value per channel (3 channels)"));
  model<network<input<3, 1, 1>, batch_norm>, TestType> images(1);
  CHECK_THROWS_AS(images.forward(run_context{}, x.data(), 1), invalid_argument);
  run_context eval;
  eval.training = false;
  CHECK_NOTHROW(m.forward(eval, x.data(), 1));  // fewer samples than channels: fine in evaluation
  model<network<input<3, 1, 2>, batch_norm>, TestType> two_pixels(1);
  const std::vector<TestType> x2{1, 2, 3, 4, 5, 7};
  CHECK_NOTHROW(two_pixels.forward(run_context{}, x2.data(), 1));  // two values per channel
}

TEST_CASE("batch_norm's fused ReLU (oneDNN's fuse_norm_relu) gives the unfused results bit for bit",
          "[layers][batch_norm][forward]") {
  // named<"r", relu> is not loom::relu, so it is not fused: the same network run unfused. Fused,
  // the ReLU runs no backward either: batch_norm's applies its gradient (oneDNN's from its mask).
  static_assert(detail::backward_fused_into_previous<batch_norm::impl<shape<16, 6, 6>, float, cpu>, relu>);
  static_assert(!detail::backward_fused_into_previous<conv2d<16, 3, 1, 1>::impl<shape<3, 6, 6>, float, cpu>, relu>);
  using fused = network<input<3, 6, 6>, conv2d<16, 3, 1, 1>, batch_norm, relu, conv2d<8, 3>, batch_norm, relu>;
  using unfused = network<input<3, 6, 6>, conv2d<16, 3, 1, 1>, batch_norm, named<"r", relu>, conv2d<8, 3>, batch_norm,
                          named<"r", relu>>;
  static_assert(fused::parameter_count == unfused::parameter_count && fused::buffer_count == unfused::buffer_count);
  model<fused, float> a(3);
  model<unfused, float> b(3);
  const auto xd = loom::testing::random_values(4 * fused::input_shape::size, 5);
  const std::vector<float> x(xd.begin(), xd.end());
  const auto dyd = loom::testing::random_values(4 * fused::output_shape::size, 6, 0.1);
  const std::vector<float> dy(dyd.begin(), dyd.end());
  for (int step = 0; step < 2; ++step) {
    const float* ya = a.forward(run_context{}, x.data(), 4);
    const float* yb = b.forward(run_context{}, x.data(), 4);
    CHECK(std::memcmp(ya, yb, dy.size() * sizeof(float)) == 0);
    a.backward(run_context{}, dy.data(), 4);
    b.backward(run_context{}, dy.data(), 4);
    CHECK(a.copy_gradients_to_host() == b.copy_gradients_to_host());
    CHECK(a.copy_buffers_to_host() == b.copy_buffers_to_host());
  }
}

TEMPLATE_TEST_CASE("batch_norm's gradients accumulate when asked", "[layers][batch_norm]", float, double) {
  using net = network<input<4, 2, 2>, conv2d<16, 1, 1, 0, no_bias>, batch_norm>;  // (a bias before batch_norm has no gradient)
  model<net, TestType> m(2);
  const auto xd = loom::testing::random_values(3 * net::input_shape::size, 7);
  const std::vector<TestType> x(xd.begin(), xd.end());
  const auto dyd = loom::testing::random_values(3 * net::output_shape::size, 8);
  const std::vector<TestType> dy(dyd.begin(), dyd.end());
  m.forward(run_context{}, x.data(), 3);
  m.backward(run_context{}, dy.data(), 3);
  const auto once = m.copy_gradients_to_host();
  run_context acc;
  acc.accumulate = true;
  m.forward(acc, x.data(), 3);
  m.backward(acc, dy.data(), 3);
  const auto twice = m.copy_gradients_to_host();
  std::vector<double> doubled(once.begin(), once.end());
  for (double& v : doubled) v *= 2;
  CHECK_THAT(values_of(twice), relatively_equals<TestType>(doubled, std::is_same_v<TestType, float> ? 1e-5 : 1e-12, 1e-6));
}

/// Two replicas of a batch (both halves alike, the group a stand-in that sums as if every rank
/// held the same values) against one replica of both, for a network net ending in batch_norm, relu:
/// `batch` samples a replica.
template <class net, class TestType>
void check_two_replicas_as_one(std::size_t batch, std::size_t zero_from = 0, std::size_t zero_to = 0) {
  model<net, TestType> one(2 * batch), both(2 * batch);
  const auto xd = loom::testing::random_values(batch * net::input_shape::size, 9);
  std::vector<TestType> x(xd.begin(), xd.end()), xx = x;
  xx.insert(xx.end(), x.begin(), x.end());
  const auto dyd = loom::testing::random_values(batch * net::output_shape::size, 10);
  std::vector<TestType> dy(dyd.begin(), dyd.end()), dydy = dy;
  dydy.insert(dydy.end(), dy.begin(), dy.end());
  same_on_every_rank group;
  run_context synced;
  synced.replicas = &group;
  const TestType* y1 = one.forward(synced, x.data(), batch);
  const std::vector<TestType> y_one(y1, y1 + dy.size());
  const TestType* y2 = both.forward(run_context{}, xx.data(), 2 * batch);
  const double t = std::is_same_v<TestType, float> ? 1e-5 : 1e-12;
  CHECK_THAT(values_of(y_one), relatively_equals<TestType>(std::vector<double>(y2, y2 + dy.size()), t, 1e-6));
  CHECK_THAT(values_of(one.copy_buffers_to_host()), relatively_equals<TestType>(both.copy_buffers_to_host(), t, 1e-6));
  one.backward(synced, dy.data(), batch);
  both.backward(run_context{}, dydy.data(), 2 * batch);
  // The input gradient is the whole batch's (the gradient sums summed over the group); the
  // parameter gradients are this rank's own, as conv2d's: the engine sums them over the
  // replicas with every other parameter (as PyTorch's SyncBatchNorm under DDP). Here each rank
  // holds half of the batch (both halves alike): half the whole batch's.
  const auto g1 = one.copy_gradients_to_host();
  auto g2 = both.copy_gradients_to_host();
  std::vector<double> doubled(g1.begin(), g1.end());
  for (double& v : doubled) v *= 2;
  // (The two sides run different kernels — loom's double sums, oneDNN's — so a float gradient
  // near 0 differs by float rounding of the large ones, ~1e-7: compared against 0.05 there.)
  // A bias before batch_norm (zero_from .. zero_to) has a gradient of 0 in exact arithmetic (the
  // input gradient sums to 0 over the batch): what both sides leave there is the rounding of
  // that cancellation, compared with the largest gradient instead.
  double largest = 0;
  for (double v : g2) largest = std::max(largest, std::abs(v));
  for (std::size_t i = zero_from; i < zero_to; ++i) {
    CHECK(std::abs(doubled[i]) <= t * largest);
    CHECK(std::abs(g2[i]) <= t * largest);
    doubled[i] = g2[i] = 0;
  }
  CHECK_THAT(values_of(doubled), relatively_equals<double>(g2, t, std::is_same_v<TestType, float> ? 0.05 : 1e-6));
}

TEMPLATE_TEST_CASE("batch_norm's statistics summed over a group: two replicas of a batch normalise as one replica of both",
                   "[layers][batch_norm][synchronized]", float, double) {
  SECTION("images after a convolution (oneDNN's blocked layout for float)") {
    // (a bias before batch_norm has no gradient)
    check_two_replicas_as_one<network<input<3, 2, 2>, conv2d<16, 1, 1, 0, no_bias>, batch_norm, relu>, TestType>(2);
  }
  SECTION("vectors after a linear layer (the plain layout)") {
    // (4 samples a replica: with 2 distinct values a channel's input gradient is 0 — batch norm
    // projects out the constant and x-hat directions, all that 2 values span.)
    check_two_replicas_as_one<network<input<6>, linear<5>, batch_norm, relu>, TestType>(4, 30, 35);  // linear's bias
  }
}

/// Two replicas, each with its own half of a batch (different samples), synchronized through a
/// group of two threads, against one replica of the whole batch: the outputs, the running
/// statistics, and the two ranks' parameter gradients added up (each rank's are its own sums).
/// The input gradient reaches the first layer's weight gradient; each rank's comes from its own
/// statistics' gradient terms corrected to the group's. `batch` samples a replica.
template <class net, class TestType>
void check_two_halves_as_one(std::size_t batch) {
  model<net, TestType> halves[2] = {model<net, TestType>(2 * batch), model<net, TestType>(2 * batch)};
  model<net, TestType> whole(2 * batch);
  const std::size_t in = net::input_shape::size, out = net::output_shape::size;
  const auto xd = loom::testing::random_values(2 * batch * in, 21);
  const auto dyd = loom::testing::random_values(2 * batch * out, 22);
  const std::vector<TestType> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
  const std::vector<TestType> y = loom::testing::train_halves(halves, x, dy, batch);
  const TestType* yw = whole.forward(run_context{}, x.data(), 2 * batch);
  whole.backward(run_context{}, dy.data(), 2 * batch);
  // The halves' statistics are the group's sums, the whole's one pass over every value: in float
  // they differ by rounding, which reaches values near 0 at the scale of the large ones (outputs
  // and running statistics of order 1: floor 0.01; gradients: a tenth of the largest).
  constexpr bool single = std::is_same_v<TestType, float>;
  const double t = single ? 1e-5 : 1e-12, floor = single ? 0.01 : 1e-6;
  CHECK_THAT(values_of(y), relatively_equals<TestType>(std::vector<double>(yw, yw + y.size()), t, floor));
  CHECK_THAT(values_of(halves[0].copy_buffers_to_host()), relatively_equals<TestType>(whole.copy_buffers_to_host(), t, floor));
  CHECK(halves[0].copy_buffers_to_host() == halves[1].copy_buffers_to_host());
  const auto g0 = halves[0].copy_gradients_to_host(), g1 = halves[1].copy_gradients_to_host();
  std::vector<double> sum(g0.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<double>(g0[i]) + static_cast<double>(g1[i]);
  const auto gw = whole.copy_gradients_to_host();
  double largest = 0;
  for (TestType v : gw) largest = std::max(largest, std::abs(static_cast<double>(v)));
  CHECK_THAT(values_of(sum), relatively_equals<double>(gw, t, single ? 0.1 * largest : 1e-6));
}

TEMPLATE_TEST_CASE("batch_norm synchronized over two replicas with different halves of a batch normalises as one replica of the whole",
                   "[layers][batch_norm][synchronized]", float, double) {
  SECTION("images after a convolution (oneDNN's blocked layout for float)") {
    check_two_halves_as_one<network<input<3, 3, 3>, conv2d<16, 1, 1, 0, no_bias>, batch_norm, relu>, TestType>(3);
  }
  SECTION("channels that no block divides (the plain layout)") {
    check_two_halves_as_one<network<input<6, 3, 3>, conv2d<5, 1, 1, 0, no_bias>, batch_norm, relu>, TestType>(3);
  }
}

namespace {

/// Batch norm of one layout by hand in double (training, the batch's statistics; with the ReLU
/// after it when relu): y, and from dy (the gradient of y) dx, dw, db, the ReLU's gradient taken
/// where `out` (the float output under test, checked against y on its own) is positive: a value
/// within rounding of 0 may fall either side.
struct by_hand {
  std::vector<double> y, dx, dw, db;
};
by_hand batch_norm_by_hand(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>& w,
                           const std::vector<float>& b, const kernels::channel_layout& l, bool relu,
                           const std::vector<float>& out) {
  const std::size_t c = l.channels, n = l.batch * l.spatial;
  std::vector<double> mean(c), invstd(c);
  for (std::size_t k = 0; k < c; ++k) {
    double s = 0, q = 0;
    for (std::size_t i = 0; i < l.batch; ++i)
      for (std::size_t p = 0; p < l.spatial; ++p) s += x[l.at(i, k, p)];
    mean[k] = s / static_cast<double>(n);
    for (std::size_t i = 0; i < l.batch; ++i)
      for (std::size_t p = 0; p < l.spatial; ++p) q += std::pow(x[l.at(i, k, p)] - mean[k], 2);
    invstd[k] = 1 / std::sqrt(q / static_cast<double>(n) + 1e-5);
  }
  by_hand h{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(c), std::vector<double>(c)};
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t k = l.channel_of(i);
    const double v = (x[i] - mean[k]) * invstd[k] * w[k] + b[k];
    h.y[i] = relu && v < 0 ? 0 : v;
    g[i] = relu && !(out[i] > 0) ? 0 : dy[i];
    h.db[k] += g[i];
    h.dw[k] += g[i] * (x[i] - mean[k]) * invstd[k];
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t k = l.channel_of(i);
    const double xhat = (x[i] - mean[k]) * invstd[k];
    h.dx[i] = w[k] * invstd[k] * (g[i] - h.db[k] / static_cast<double>(n) - xhat * h.dw[k] / static_cast<double>(n));
  }
  return h;
}

template <class V>
double largest_difference(const std::vector<float>& got, const std::vector<V>& want) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    d = std::max(d, std::abs(got[i] - static_cast<double>(want[i])));
    m = std::max(m, std::abs(static_cast<double>(want[i])));
  }
  return d / std::max(m, 1e-30);
}

}  // namespace

TEST_CASE("batch_norm's own passes (channels-last, or synchronized on blocked layouts) agree with the arithmetic by hand",
          "[layers][batch_norm][rows]") {
  struct layout_case {
    std::size_t c, block;  // block == c: channels-last
    bool synchronized;
  };
  // Channels-last of 24, 40 (a 16, an 8 and a rest of pieces) and 3 channels, and blocked ones; 10 x 13 pixels: runs of
  // more rows than a 64-row chunk. A channel's values sit far from 0 (a mean 3 + c, spread 0.5).
  const layout_case cases[] = {{24, 24, false}, {40, 40, false}, {3, 3, true},  {40, 40, true},
                               {32, 16, true},  {24, 8, true},   {56, 56, false}};
  const std::size_t batch = 6, h = 10, wd = 13;
  for (const layout_case lc : cases)
    for (const bool relu : {false, true}) {
      CAPTURE(lc.c, lc.block, lc.synchronized, relu);
      const batch_norm_geometry g{lc.c, h, wd, 3, 1e-5};
      const kernels::channel_layout l{batch, lc.c, h * wd, lc.block};
      std::vector<float> x(l.size()), dy(l.size()), w(lc.c), b(lc.c);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::size_t k = l.channel_of(i);
        x[i] = 3.0f + static_cast<float>(k) + 0.5f * std::sin(0.37f * static_cast<float>(i) + 0.1f * static_cast<float>(k));
        dy[i] = std::cos(0.23f * static_cast<float>(i));
      }
      for (std::size_t k = 0; k < lc.c; ++k) w[k] = 0.5f + 0.1f * static_cast<float>(k % 7), b[k] = 0.05f * static_cast<float>(k % 5) - 0.1f;
      const cpu_format f = lc.block == lc.c ? detail::channels_last_nchw(batch, lc.c, h, wd)
                                            : detail::blocked_nchw(batch, lc.c, h, wd, lc.block);
      REQUIRE(detail::channel_block(f, batch, lc.c, h, wd) == lc.block);
      cpu_batch_norm_plan<float> plan(g);
      if (relu) plan.fuse_relu();
      same_on_every_rank group;
      process_group* replicas = lc.synchronized ? &group : nullptr;
      std::vector<float> y(x.size()), dx(x.size()), dw(lc.c), db(lc.c), rm(lc.c, 0.0f), rv(lc.c, 1.0f);
      plan.forward_training(x.data(), f, w.data(), b.data(), y.data(), rm.data(), rv.data(), 0.1, batch, replicas);
      CHECK(plan.backward_applies_fused_relu() == relu);
      plan.backward(x.data(), f, w.data(), b.data(), dy.data(), dx.data(), dw.data(), db.data(), batch, false, replicas,
                    y.data());
      const by_hand want = batch_norm_by_hand(x, dy, w, b, l, relu, y);
      CHECK(largest_difference(y, want.y) < 1e-5);
      CHECK(largest_difference(dx, want.dx) < 1e-4);
      // The parameter gradients are this rank's own, synchronized or not.
      CHECK(largest_difference(dw, want.dw) < 1e-4);
      CHECK(largest_difference(db, want.db) < 1e-5);
      // The running statistics: the batch's (over every replica: the same values twice), momentum 0.1.
      for (std::size_t k = 0; k < lc.c; ++k) {
        double s = 0, q = 0;
        const std::size_t n = batch * h * wd;
        for (std::size_t i = 0; i < x.size(); ++i)
          if (l.channel_of(i) == k) s += x[i];
        const double m = s / static_cast<double>(n);
        for (std::size_t i = 0; i < x.size(); ++i)
          if (l.channel_of(i) == k) q += std::pow(x[i] - m, 2);
        const double count = lc.synchronized ? 2.0 * static_cast<double>(n) : static_cast<double>(n);
        CHECK(rm[k] == Approx(0.1 * m).epsilon(1e-6));
        CHECK(rv[k] == Approx(0.9 + 0.1 * q * (count / static_cast<double>(n)) / (count - 1)).epsilon(1e-5));
      }
    }
}

TEST_CASE("batch_norm's own sums give the same bits on one thread and on two", "[layers][batch_norm][rows]") {
  const std::size_t batch = 16, c = 40, spatial = 12 * 12;
  std::vector<float> x(batch * c * spatial), dy(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + std::sin(0.11f * static_cast<float>(i)), dy[i] = std::cos(0.7f * static_cast<float>(i));
  const detail::batch_norm_rows_layout l{batch, c, spatial, c};
  std::vector<float> mean(c, 1.0f), scale(c, 1.5f), shift(c, 0.25f);  // a fused ReLU's gradient: where x > 1 - 1/6
  auto sums = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<double> partials(detail::batch_norm_rows_partials(c)), s(4 * c + 1);
    detail::batch_norm_rows_sums(x.data(), l, partials.data(), s.data());
    detail::batch_norm_rows_gradient_sums(x.data(), dy.data(), l, mean.data(), scale.data(), shift.data(), partials.data(),
                                          s.data() + 2 * c + 1);
    return s;
  };
  const int before = omp_get_max_threads();
  const std::vector<double> one = sums(1), two = sums(2), three = sums(3);
  omp_set_num_threads(before);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(double)) == 0);
  CHECK(std::memcmp(one.data(), three.data(), one.size() * sizeof(double)) == 0);
  CHECK(one[2 * c] == static_cast<double>(batch * spatial));
  // The layer's memory plan counts the passes' scratch: the shares' partial sums among it.
  STATIC_REQUIRE(batch_norm::rows_scratch_per_channel >= 2 * detail::batch_norm_rows_partials(1) + 8 + 6);
}
