// SPDX-License-Identifier: Apache-2.0
// The optimizers on buffers of 1, 7 and 100003 elements (the last takes the threaded path)
// against a plain element-by-element transcription of PyTorch's update rules.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/optim.hpp"
#include "problem.hpp"

namespace {

constexpr std::size_t steps = 3;
const float lrs[steps] = {0.1f, 0.05f, 0.025f};

/// Checks every element: |got - want| <= rel * max(|want|, 1) — the values here are computed
/// the same way, so only contraction into fused multiply-adds may tell them apart.
template <class T>
void check_all(const char* what, const std::vector<T>& got, const std::vector<T>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    if (!(std::abs(g - w) <= rel * std::fmax(std::abs(w), 1.0))) {
      FAIL_CHECK(what << "[" << i << "] = " << g << " but want " << w);
      return;
    }
  }
  SUCCEED();
}

/// torch.optim.SGD (_single_tensor_sgd) on one element.
template <class T>
void reference_sgd(const loom::sgd::options& o, float lr, std::size_t t, T& p, T g, T& buf) {
  T d = g;
  if (o.weight_decay != 0) d = d + T(o.weight_decay) * p;
  if (o.momentum != 0) {
    buf = t == 0 ? d : T(o.momentum) * buf + d;
    d = o.nesterov ? d + T(o.momentum) * buf : buf;
  }
  p = p + T(-lr) * d;
}

/// torch.optim.Adam / AdamW (_single_tensor_adam(w), amsgrad off) on one element at step t (from 1).
template <class T, class Options>
void reference_adam(const Options& o, bool decoupled, float lr, std::size_t t, T& p, T g, T& m, T& v) {
  if (decoupled) p = p * T(1 - double(lr) * double(o.weight_decay));
  if (!decoupled && o.weight_decay != 0) g = g + T(o.weight_decay) * p;
  m = m * T(o.beta1) + T(1 - double(o.beta1)) * g;
  v = v * T(o.beta2) + T(1 - double(o.beta2)) * g * g;
  const double bc1 = 1 - std::pow(double(o.beta1), double(t));
  const double bc2 = 1 - std::pow(double(o.beta2), double(t));
  const T denom = std::sqrt(v) / T(std::sqrt(bc2)) + T(o.eps);
  p = p + T(-(double(lr) / bc1)) * m / denom;
}

}  // namespace

TEMPLATE_TEST_CASE("SGD updates every element of buffers of 1, 7 and 100003 parameters", "[optim][sgd]", double,
                   float) {
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{100003});
  const loom::sgd::options o{.lr = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 0.01f};
  INFO("n = " << n);
  loom::sgd::state<TestType, loom::cpu> s(o, n);
  std::vector<TestType> p = loom_test::initial_params<TestType>(n);
  std::vector<TestType> want = p;
  std::vector<TestType> buf(n);
  for (std::size_t t = 0; t < steps; ++t) {
    const std::vector<TestType> g = loom_test::grads_at<TestType>(n, t);
    s.step(p.data(), g.data(), n, lrs[t]);
    for (std::size_t i = 0; i < n; ++i) reference_sgd(o, lrs[t], t, want[i], g[i], buf[i]);
  }
  const double rel = loom_test::relative_tolerance<TestType>();
  check_all("param", p, want, rel);
  check_all("momentum_buffer", std::vector<TestType>(s.buffers().begin(), s.buffers().end()), buf, rel);
}

TEMPLATE_TEST_CASE("Adam and AdamW update every element of buffers of 1, 7 and 100003 parameters", "[optim][adam]",
                   double, float) {
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{100003});
  const bool decoupled = GENERATE(false, true);
  INFO("n = " << n << (decoupled ? ", adamw" : ", adam"));
  const loom::adam::options o{.lr = 0.1f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.05f};
  std::vector<TestType> p = loom_test::initial_params<TestType>(n);
  std::vector<TestType> want = p;
  std::vector<TestType> m(n), v(n);
  auto run = [&](auto&& s) {
    for (std::size_t t = 0; t < steps; ++t) {
      const std::vector<TestType> g = loom_test::grads_at<TestType>(n, t);
      s.step(p.data(), g.data(), n, lrs[t]);
      for (std::size_t i = 0; i < n; ++i) reference_adam(o, decoupled, lrs[t], t + 1, want[i], g[i], m[i], v[i]);
    }
    const double rel = loom_test::relative_tolerance<TestType>();
    check_all("param", p, want, rel);
    check_all("exp_avg", std::vector<TestType>(s.buffers().begin(), s.buffers().begin() + n), m, rel);
    check_all("exp_avg_sq", std::vector<TestType>(s.buffers().begin() + n, s.buffers().end()), v, rel);
  };
  if (decoupled) {
    run(loom::adamw::state<TestType, loom::cpu>(
        {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay}, n));
  } else {
    run(loom::adam::state<TestType, loom::cpu>(o, n));
  }
}

TEST_CASE("A step at learning rate 0 leaves SGD parameters unchanged", "[optim][sgd]") {
  loom::sgd::state<float, loom::cpu> s({.lr = 0.1f, .momentum = 0.9f}, 3);
  std::vector<float> p{1, 2, 3};
  const std::vector<float> g{1, 1, 1};
  s.step(p.data(), g.data(), 3, 0.0f);
  CHECK(p == std::vector<float>{1, 2, 3});
}

TEST_CASE("Optimizers over zero parameters step without touching memory", "[optim]") {
  loom::sgd::state<float, loom::cpu> s({.momentum = 0.5f}, 0);
  s.step(nullptr, nullptr, 0, 0.1f);
  loom::adamw::state<float, loom::cpu> a({}, 0);
  a.step(nullptr, nullptr, 0, 0.1f);
  CHECK(s.buffers().empty());
  CHECK(a.buffers().empty());
  CHECK(a.steps() == 1);
}
