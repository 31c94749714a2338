// SPDX-License-Identifier: Apache-2.0
// Golden tests: loom's SGD, Adam and AdamW against torch.optim (values in golden.hpp), in double
// (relative 1e-12) and float (relative 1e-6), with a learning rate that changes between steps.

#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "golden.hpp"
#include "loom/backend/cpu.hpp"
#include "loom/optim.hpp"
#include "problem.hpp"

namespace golden = loom_test::golden;
using loom_test::check_close;
using loom_test::relative_tolerance;

TEMPLATE_TEST_CASE("SGD matches torch.optim.SGD step by step", "[optim][sgd]", double, float) {
  const double rel = relative_tolerance<TestType>();
  for (const golden::sgd_case& c : golden::sgd_cases) {
    SECTION(c.name) {
      const loom::sgd::options o{.lr = c.lrs[0], .momentum = c.momentum, .nesterov = c.nesterov,
                                 .weight_decay = c.weight_decay};
      loom::sgd::state<TestType, loom::cpu> s(o, golden::n);
      std::vector<TestType> p = loom_test::initial_params<TestType>(golden::n);
      for (std::size_t t = 0; t < golden::steps; ++t) {
        const std::vector<TestType> g = loom_test::grads_at<TestType>(golden::n, t);
        s.step(p.data(), g.data(), golden::n, c.lrs[t]);
        INFO("after step " << t + 1);
        check_close("param", p.data(), c.params[t], golden::n, rel);
      }
      CHECK(s.steps() == golden::steps);
      if (c.momentum > 0) {
        REQUIRE(s.buffers().size() == golden::n);
        check_close("momentum_buffer", s.buffers().data(), c.momentum_buffer, golden::n, rel);
      } else {
        CHECK(s.buffers().empty());
      }
    }
  }
}

TEMPLATE_TEST_CASE("Adam and AdamW match torch.optim.Adam and torch.optim.AdamW step by step", "[optim][adam]",
                   double, float) {
  const double rel = relative_tolerance<TestType>();
  for (const golden::adam_case& c : golden::adam_cases) {
    SECTION(c.name) {
      std::vector<TestType> p = loom_test::initial_params<TestType>(golden::n);
      auto run = [&](auto&& s) {
        for (std::size_t t = 0; t < golden::steps; ++t) {
          const std::vector<TestType> g = loom_test::grads_at<TestType>(golden::n, t);
          s.step(p.data(), g.data(), golden::n, c.lrs[t]);
          INFO("after step " << t + 1);
          check_close("param", p.data(), c.params[t], golden::n, rel);
        }
        CHECK(s.steps() == golden::steps);
        REQUIRE(s.buffers().size() == 2 * golden::n);
        check_close("exp_avg", s.buffers().data(), c.exp_avg, golden::n, rel);
        check_close("exp_avg_sq", s.buffers().data() + golden::n, c.exp_avg_sq, golden::n, rel);
      };
      if (c.decoupled) {
        run(loom::adamw::state<TestType, loom::cpu>(
            {.lr = c.lrs[0], .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps, .weight_decay = c.weight_decay},
            golden::n));
      } else {
        run(loom::adam::state<TestType, loom::cpu>(
            {.lr = c.lrs[0], .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps, .weight_decay = c.weight_decay},
            golden::n));
      }
    }
  }
}
