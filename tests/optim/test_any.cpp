// SPDX-License-Identifier: Apache-2.0
// loom::any_optimizer: the optimizer chosen at run time is the chosen one, bitwise — step and
// step_part of SGD (plain, momentum, Nesterov, weight decay), Adam and AdamW over several steps,
// the state's buffers and step count — with its name, buffer names, state size and learning
// rate, and its option checks with the chosen optimizer's own messages.

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/core/error.hpp"
#include "loom/optim.hpp"

namespace {

template <class Optimizer>
void same_as_chosen(const typename Optimizer::options& o) {
  constexpr std::size_t n = 70001;  // large enough for the threaded path
  std::vector<float> p(n), q(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = q[i] = 0.01f * static_cast<float>((i * 37) % 201) - 1.0f;
    g[i] = 0.001f * static_cast<float>((i * 91) % 301) - 0.15f;
  }
  typename Optimizer::template state<float, loom::cpu> chosen(o, n);
  loom::any_optimizer::state<float, loom::cpu> any(o, n);
  for (int step = 0; step < 5; ++step) {
    const float lr = 0.05f / static_cast<float>(step + 1);
    chosen.step(p.data(), g.data(), n, lr);
    if (step % 2) {
      any.step(q.data(), g.data(), n, lr);
    } else {  // as ZeRO steps a rank's slices
      any.step_part(q.data() + 5, g.data() + 5, 5, n - 5, lr);
      any.step_part(q.data(), g.data(), 0, 5, lr);
      any.end_step();
    }
  }
  CHECK(p == q);
  CHECK(any.steps() == chosen.steps());
  const auto a = chosen.buffers(), b = any.buffers();
  CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
  any.set_steps(11);
  CHECK(any.steps() == 11);
  CHECK(std::string(any.opts().name()) == Optimizer::name);

  const loom::any_optimizer::options ao = o;
  CHECK(std::string(ao.name()) == Optimizer::name);
  CHECK(ao.lr() == o.lr);
  CHECK(loom::any_optimizer::state_values_per_parameter(ao) == Optimizer::state_values_per_parameter(o));
  const auto names = loom::any_optimizer::buffer_names(ao);
  REQUIRE(names.size() == std::size(Optimizer::buffer_names));
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(std::string(names[i]) == Optimizer::buffer_names[i]);
  REQUIRE(ao.get_if<Optimizer>() != nullptr);
  CHECK(ao.get_if<Optimizer>()->lr == o.lr);
}

}  // namespace

TEST_CASE("any_optimizer is the optimizer its options choose, bitwise", "[optim][any]") {
  same_as_chosen<loom::sgd>({.lr = 0.1f});
  same_as_chosen<loom::sgd>({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f});
  same_as_chosen<loom::sgd>({.lr = 0.1f, .momentum = 0.9f, .nesterov = true});
  same_as_chosen<loom::adam>({.lr = 1e-3f, .weight_decay = 1e-4f});
  same_as_chosen<loom::adamw>({.lr = 1e-3f});
}

TEST_CASE("any_optimizer's defaults are SGD's, and its facts are constant expressions", "[optim][any]") {
  constexpr loom::any_optimizer::options none{};
  static_assert(loom::any_optimizer::state_values_per_parameter(none) == 0);
  static_assert(loom::any_optimizer::state_values_per_parameter(loom::sgd::options{.momentum = 0.5f}) == 1);
  static_assert(loom::any_optimizer::state_values_per_parameter(loom::adamw::options{}) == 2);
  static_assert(loom::any_optimizer::options(loom::adam::options{.lr = 0.5f}).lr() == 0.5f);
  CHECK(std::string(none.name()) == "sgd");
  CHECK(none.lr() == loom::sgd::options{}.lr);
  CHECK(none.get_if<loom::adam>() == nullptr);
  CHECK(loom::any_optimizer::buffer_names(none).size() == 1);  // SGD's names, whether or not it keeps the buffer
  loom::any_optimizer::state<float, loom::cpu> s(none, 10);
  CHECK(s.buffers().empty());
}

TEST_CASE("any_optimizer refuses bad options with the chosen optimizer's message", "[optim][any]") {
  CHECK_THROWS_AS((loom::any_optimizer::state<float, loom::cpu>(loom::sgd::options{.lr = 0.1f, .nesterov = true}, 4)),
                  loom::invalid_argument);
  const auto message = [](const loom::any_optimizer::options& o) -> std::string {
    try {
      loom::any_optimizer::state<float, loom::cpu> s(o, 4);
    } catch (const loom::invalid_argument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const auto own = [](auto o) -> std::string {
    try {
      typename loom::detail::optimizer_of_t<decltype(o)>::template state<float, loom::cpu> s(o, 4);
    } catch (const loom::invalid_argument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const loom::sgd::options bad_sgd{.lr = 0.1f, .momentum = 1.5f};
  const loom::adam::options bad_adam{.lr = -1.0f};
  const loom::adamw::options bad_adamw{.beta2 = 1.0f};
  CHECK(message(bad_sgd) == own(bad_sgd));
  CHECK(message(bad_adam) == own(bad_adam));
  CHECK(message(bad_adamw) == own(bad_adamw));
  CHECK(message(bad_adamw).find("loom::adamw") != std::string::npos);
  CHECK(message(bad_sgd).find("momentum") != std::string::npos);
  // step() checks as the chosen one does.
  std::vector<float> p(4), g(4);
  loom::any_optimizer::state<float, loom::cpu> s(loom::adam::options{}, 4);
  CHECK_THROWS_WITH(s.step_part(p.data(), g.data(), 2, 3, 0.1f),
                    "loom::adam: step_part() was given values [2, 5), but the state holds 4");
}
