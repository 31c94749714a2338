// SPDX-License-Identifier: Apache-2.0
// softmax_cross_entropy with label smoothing (loss_workspace::label_smoothing, as
// torch.nn.CrossEntropyLoss(label_smoothing=eps)): the values and gradients against the direct
// formula in long double for random logits, a finite-difference check of the gradient of the mean
// loss, eps = 0 bitwise the plain loss's kernel, and the accuracy still the argmax's. (Against
// PyTorch itself: recipe_fixtures and check_recipe_torch.py in tests/train.)

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/nn/loss.hpp"

namespace {

using loom::cpu;
using loom::loss_workspace;
using loom::softmax_cross_entropy;

constexpr std::size_t classes = 7;

struct problem {
  std::vector<double> z;
  std::vector<std::int32_t> labels;
};

problem random_problem(std::size_t batch, unsigned seed, double spread) {
  std::mt19937 g(seed);
  std::normal_distribution<double> n(0.0, spread);
  std::uniform_int_distribution<int> c(0, classes - 1);
  problem p;
  for (std::size_t i = 0; i < batch * classes; ++i) p.z.push_back(n(g));
  for (std::size_t i = 0; i < batch; ++i) p.labels.push_back(c(g));
  return p;
}

/// -sum_j t_j log softmax(z)_j, t = (1 - eps) one_hot + eps / C, in long double.
long double reference_loss(const double* z, std::int32_t label, double eps) {
  long double m = z[0];
  for (std::size_t j = 1; j < classes; ++j) m = std::max<long double>(m, z[j]);
  long double s = 0;
  for (std::size_t j = 0; j < classes; ++j) s += std::exp(static_cast<long double>(z[j]) - m);
  const long double lse = m + std::log(s);
  long double loss = 0;
  for (std::size_t j = 0; j < classes; ++j) {
    const long double t = (j == static_cast<std::size_t>(label) ? 1.0L - eps : 0.0L) + eps / classes;
    loss -= t * (z[j] - lse);
  }
  return loss;
}

long double reference_mean(const problem& p, double eps) {
  const std::size_t batch = p.labels.size();
  long double s = 0;
  for (std::size_t n = 0; n < batch; ++n) s += reference_loss(p.z.data() + n * classes, p.labels[n], eps);
  return s / batch;
}

}  // namespace

TEMPLATE_TEST_CASE("loss softmax_cross_entropy with label smoothing: values and gradients against the formula",
                   "[layers][loss][label_smoothing]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  for (double spread : {1.0, 30.0}) {
    const problem p = random_problem(19, 11, spread);
    const std::size_t batch = p.labels.size();
    const std::vector<T> z(p.z.begin(), p.z.end());
    for (double eps : {0.0, 0.05, 0.1, 0.5, 0.9}) {
      CAPTURE(spread, eps);
      loss_workspace<cpu> ws;
      ws.label_smoothing = static_cast<float>(eps);
      const double e = static_cast<double>(static_cast<float>(eps));  // the value the loss takes
      std::vector<T> grad(z.size());
      const auto v = softmax_cross_entropy::compute<cpu, classes>(z.data(), p.labels.data(), grad.data(), batch, T(0.5), ws);
      std::size_t correct = 0;
      for (std::size_t n = 0; n < batch; ++n) {
        const double* row = p.z.data() + n * classes;
        // The float row's own values: the reference takes what the loss saw.
        std::vector<double> seen(z.begin() + static_cast<std::ptrdiff_t>(n * classes),
                                 z.begin() + static_cast<std::ptrdiff_t>((n + 1) * classes));
        const double want = static_cast<double>(reference_loss(seen.data(), p.labels[n], e));
        CHECK(ws.per_sample.data()[n] == Approx(want).epsilon(tol).margin(tol * spread));
        // softmax - t, times the scale.
        std::size_t arg = 0;
        double m = seen[0], s = 0;
        for (std::size_t j = 1; j < classes; ++j)
          if (seen[j] > m) m = seen[j], arg = j;
        for (std::size_t j = 0; j < classes; ++j) s += std::exp(seen[j] - m);
        for (std::size_t j = 0; j < classes; ++j) {
          const double t = (j == static_cast<std::size_t>(p.labels[n]) ? 1.0 - e : 0.0) + e / classes;
          CHECK(static_cast<double>(grad[n * classes + j]) == Approx(0.5 * (std::exp(seen[j] - m) / s - t)).margin(tol));
        }
        correct += arg == static_cast<std::size_t>(p.labels[n]);
        (void)row;
      }
      // Accuracy stays the argmax's.
      CHECK(v.correct == correct);
    }
  }
}

TEST_CASE("loss softmax_cross_entropy with label smoothing: the gradient is that of the mean loss",
          "[layers][loss][label_smoothing][gradient]") {
  const problem p = random_problem(5, 3, 2.0);
  const std::size_t batch = p.labels.size();
  for (double eps : {0.1, 0.3}) {
    CAPTURE(eps);
    const double e = static_cast<double>(static_cast<float>(eps));
    loss_workspace<cpu> ws;
    ws.label_smoothing = static_cast<float>(eps);
    std::vector<double> grad(p.z.size());
    softmax_cross_entropy::compute<cpu, classes>(p.z.data(), p.labels.data(), grad.data(), batch, 1.0 / batch, ws);
    const double h = 1e-6;
    double worst = 0;
    for (std::size_t i = 0; i < p.z.size(); ++i) {
      problem q = p;
      q.z[i] = p.z[i] + h;
      const long double up = reference_mean(q, e);
      q.z[i] = p.z[i] - h;
      const long double down = reference_mean(q, e);
      const double numeric = static_cast<double>((up - down) / (2 * h));
      worst = std::max(worst, std::abs(numeric - grad[i]) / std::max(1e-4, std::abs(numeric)));
    }
    CHECK(worst < 1e-6);
    // loom's mean loss is the formula's.
    const auto v = softmax_cross_entropy::compute<cpu, classes>(p.z.data(), p.labels.data(), static_cast<double*>(nullptr),
                                                                 batch, 1.0, ws);
    CHECK(v.sum / batch == Approx(static_cast<double>(reference_mean(p, e))).epsilon(1e-13));
  }
}

/// softmax_cross_entropy_row as it was before label smoothing, verbatim: eps = 0 must be it.
template <class T, std::size_t Classes>
struct unsmoothed_row {
  const T* logits;
  const std::int32_t* labels;
  T* grad;
  double* loss;
  std::uint8_t* correct;
  T scale;
  void operator()(std::size_t n) const {
    const T* z = logits + n * Classes;
    T m = z[0];
    std::size_t arg = 0;
    for (std::size_t j = 1; j < Classes; ++j)
      if (z[j] > m) m = z[j], arg = j;
    T s = 0;
    for (std::size_t j = 0; j < Classes; ++j) s += std::exp(z[j] - m);
    const auto label = static_cast<std::size_t>(labels[n]);
    loss[n] = static_cast<double>((m - z[label]) + std::log(s));
    correct[n] = arg == label;
    if (grad) {
      T* g = grad + n * Classes;
      const T inv = T(1) / s;
      for (std::size_t j = 0; j < Classes; ++j) g[j] = (std::exp(z[j] - m) * inv - (j == label ? T(1) : T(0))) * scale;
    }
  }
};

TEST_CASE("loss softmax_cross_entropy with label smoothing 0 is bitwise the plain loss", "[layers][loss][label_smoothing]") {
  for (double spread : {1.0, 10.0, 1000.0}) {
    const problem p = random_problem(33, 5, spread);
    const std::size_t batch = p.labels.size();
    const std::vector<float> z(p.z.begin(), p.z.end());
    std::vector<float> grad(z.size()), plain_grad(z.size());
    std::vector<double> plain_loss(batch);
    std::vector<std::uint8_t> plain_correct(batch);
    const unsmoothed_row<float, classes> plain{z.data(),          p.labels.data(),      plain_grad.data(),
                                               plain_loss.data(), plain_correct.data(), 0.25f};
    for (std::size_t n = 0; n < batch; ++n) plain(n);
    loss_workspace<cpu> ws;  // label_smoothing 0 by default
    REQUIRE(ws.label_smoothing == 0.0f);
    softmax_cross_entropy::compute<cpu, classes>(z.data(), p.labels.data(), grad.data(), batch, 0.25f, ws);
    CHECK(grad == plain_grad);
    for (std::size_t n = 0; n < batch; ++n) {
      CHECK(ws.per_sample.data()[n] == plain_loss[n]);
      CHECK(ws.correct.data()[n] == plain_correct[n]);
    }
  }
}
