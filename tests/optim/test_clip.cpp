// SPDX-License-Identifier: Apache-2.0
// Tests of loom::clip_grad_norm: the norm it returns, the scaled result (as
// torch.nn.utils.clip_grad_norm_), the no-op under the limit, the threaded path and its checks.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/optim/clip.hpp"

using Catch::Matchers::Equals;

TEMPLATE_TEST_CASE("clip_grad_norm scales gradients above the limit to the limit", "[optim][clip]", double, float) {
  std::vector<TestType> g{3, 4};
  const double norm = loom::clip_grad_norm<loom::cpu>(g.data(), g.size(), 1.0);
  CHECK(norm == 5.0);
  const auto factor = static_cast<TestType>(1.0 / (5.0 + 1e-6));
  CHECK(g[0] == TestType(3) * factor);
  CHECK(g[1] == TestType(4) * factor);
  CHECK(std::hypot(double(g[0]), double(g[1])) == Approx(1.0).epsilon(1e-6));
}

TEMPLATE_TEST_CASE("clip_grad_norm leaves gradients under the limit untouched", "[optim][clip]", double, float) {
  std::vector<TestType> g{3, -4, 0};
  CHECK(loom::clip_grad_norm<loom::cpu>(g.data(), g.size(), 10.0) == 5.0);
  CHECK(g == std::vector<TestType>{3, -4, 0});
  CHECK(loom::clip_grad_norm<loom::cpu>(g.data(), g.size(), 5.0 + 1e-6) == 5.0);
  CHECK(g == std::vector<TestType>{3, -4, 0});
}

TEST_CASE("clip_grad_norm of nothing is zero", "[optim][clip]") {
  CHECK(loom::clip_grad_norm<loom::cpu, float>(nullptr, 0, 1.0) == 0.0);
}

TEMPLATE_TEST_CASE("clip_grad_norm is right on a buffer large enough to be threaded", "[optim][clip]", double, float) {
  const std::size_t n = 100003;
  std::vector<TestType> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = (i % 2 ? TestType(-1) : TestType(1)) * TestType(2);
  const double norm = loom::clip_grad_norm<loom::cpu>(g.data(), n, 3.0);
  CHECK(norm == Approx(2.0 * std::sqrt(double(n))).epsilon(1e-12));
  const auto factor = static_cast<TestType>(3.0 / (norm + 1e-6));
  for (std::size_t i = 0; i < n; ++i) {
    if (g[i] != (i % 2 ? TestType(-2) : TestType(2)) * factor) FAIL("element " << i << " was not scaled");
  }
  double sq = 0;
  for (TestType v : g) sq += double(v) * double(v);
  CHECK(std::sqrt(sq) == Approx(3.0).epsilon(1e-6));
}

TEST_CASE("clip_grad_norm returns a non-finite norm and leaves the gradients alone", "[optim][clip]") {
  std::vector<float> g{1, std::numeric_limits<float>::infinity(), 2};
  CHECK(std::isinf(loom::clip_grad_norm<loom::cpu>(g.data(), g.size(), 1.0)));
  CHECK(g[0] == 1.0f);
  CHECK(g[2] == 2.0f);
  g[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(loom::clip_grad_norm<loom::cpu>(g.data(), g.size(), 1.0)));
  CHECK(g[0] == 1.0f);
}

TEST_CASE("clip_grad_norm rejects a max_norm that is not positive", "[optim][clip]") {
  std::vector<float> g{1, 2};
  auto message = [&](double max_norm) -> std::string {
    try {
      (void)loom::clip_grad_norm<loom::cpu>(g.data(), g.size(), max_norm);
    } catch (const loom::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  CHECK_THAT(message(0.0), Equals("loom::clip_grad_norm: max_norm must be finite and > 0, but is 0"));
  CHECK_THAT(message(-1.5), Equals("loom::clip_grad_norm: max_norm must be finite and > 0, but is -1.5"));
  CHECK_THAT(message(std::numeric_limits<double>::quiet_NaN()),
             Equals("loom::clip_grad_norm: max_norm must be finite and > 0, but is nan"));
  CHECK(g == std::vector<float>{1, 2});
}
