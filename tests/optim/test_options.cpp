// SPDX-License-Identifier: Apache-2.0
// The optimizers' option defaults and every check of options and step() arguments, each with
// the exact message: who complains, about which option, the expected range and the value found.

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/optim.hpp"

using Catch::Matchers::Equals;

namespace {

/// The message of the loom::invalid_argument that f() throws.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const loom::invalid_argument& e) {
    return e.what();
  }
  FAIL("no loom::invalid_argument was thrown");
  return {};
}

std::string sgd_error(const loom::sgd::options& o) {
  return message_of([&] { loom::sgd::state<float, loom::cpu> s(o, 4); });
}
template <class Optimizer>
std::string adam_error(const typename Optimizer::options& o) {
  return message_of([&] { typename Optimizer::template state<float, loom::cpu> s(o, 4); });
}

}  // namespace

TEST_CASE("Optimizer options default to PyTorch's defaults", "[optim]") {
  constexpr loom::sgd::options s{};
  STATIC_REQUIRE(s.lr == 0.01f);
  STATIC_REQUIRE(s.momentum == 0.0f);
  STATIC_REQUIRE(!s.nesterov);
  STATIC_REQUIRE(s.weight_decay == 0.0f);
  constexpr loom::adam::options a{};
  STATIC_REQUIRE(a.lr == 1e-3f);
  STATIC_REQUIRE(a.beta1 == 0.9f);
  STATIC_REQUIRE(a.beta2 == 0.999f);
  STATIC_REQUIRE(a.eps == 1e-8f);
  STATIC_REQUIRE(a.weight_decay == 0.0f);
  constexpr loom::adamw::options w{};
  STATIC_REQUIRE(w.lr == 1e-3f);
  STATIC_REQUIRE(w.weight_decay == 1e-2f);
  STATIC_REQUIRE(std::string_view(loom::sgd::name) == "sgd");
  STATIC_REQUIRE(std::string_view(loom::adam::name) == "adam");
  STATIC_REQUIRE(std::string_view(loom::adamw::name) == "adamw");
}

TEST_CASE("A state keeps its options and sizes its buffers", "[optim]") {
  const loom::sgd::state<double, loom::cpu> plain({.lr = 0.5f}, 5);
  CHECK(plain.opts().lr == 0.5f);
  CHECK(plain.buffers().empty());
  loom::sgd::state<double, loom::cpu> momentum({.momentum = 0.9f}, 5);
  CHECK(momentum.buffers().size() == 5);
  loom::adam::state<float, loom::cpu> adam({.eps = 1e-6f}, 5);
  CHECK(adam.opts().eps == 1e-6f);
  CHECK(adam.buffers().size() == 10);
  for (float x : adam.buffers()) CHECK(x == 0.0f);
  adam.set_steps(41);
  CHECK(adam.steps() == 41);
}

TEST_CASE("SGD rejects each option out of range, naming it, its range and its value", "[optim][sgd]") {
  CHECK_THAT(sgd_error({.lr = 0.0f}), Equals("loom::sgd: option lr must be finite and > 0, but is 0"));
  CHECK_THAT(sgd_error({.lr = -0.5f}), Equals("loom::sgd: option lr must be finite and > 0, but is -0.5"));
  CHECK_THAT(sgd_error({.lr = NAN}), Equals("loom::sgd: option lr must be finite and > 0, but is nan"));
  CHECK_THAT(sgd_error({.lr = INFINITY}), Equals("loom::sgd: option lr must be finite and > 0, but is inf"));
  CHECK_THAT(sgd_error({.momentum = 1.0f}), Equals("loom::sgd: option momentum must be in [0, 1), but is 1"));
  CHECK_THAT(sgd_error({.momentum = -0.25f}), Equals("loom::sgd: option momentum must be in [0, 1), but is -0.25"));
  CHECK_THAT(sgd_error({.nesterov = true}),
             Equals("loom::sgd: option momentum must be > 0 when nesterov is true, but is 0"));
  CHECK_THAT(sgd_error({.weight_decay = -0.125f}),
             Equals("loom::sgd: option weight_decay must be finite and >= 0, but is -0.125"));
}

TEST_CASE("Adam rejects each option out of range, naming it, its range and its value", "[optim][adam]") {
  CHECK_THAT(adam_error<loom::adam>({.lr = 0.0f}), Equals("loom::adam: option lr must be finite and > 0, but is 0"));
  CHECK_THAT(adam_error<loom::adam>({.beta1 = 1.0f}), Equals("loom::adam: option beta1 must be in [0, 1), but is 1"));
  CHECK_THAT(adam_error<loom::adam>({.beta1 = -0.5f}),
             Equals("loom::adam: option beta1 must be in [0, 1), but is -0.5"));
  CHECK_THAT(adam_error<loom::adam>({.beta2 = 1.5f}), Equals("loom::adam: option beta2 must be in [0, 1), but is 1.5"));
  CHECK_THAT(adam_error<loom::adam>({.eps = 0.0f}), Equals("loom::adam: option eps must be finite and > 0, but is 0"));
  CHECK_THAT(adam_error<loom::adam>({.eps = -1e-8f}),
             Equals("loom::adam: option eps must be finite and > 0, but is -1e-08"));
  CHECK_THAT(adam_error<loom::adam>({.weight_decay = -1.0f}),
             Equals("loom::adam: option weight_decay must be finite and >= 0, but is -1"));
}

TEST_CASE("AdamW rejects each option out of range, naming it, its range and its value", "[optim][adam]") {
  CHECK_THAT(adam_error<loom::adamw>({.lr = -1.0f}),
             Equals("loom::adamw: option lr must be finite and > 0, but is -1"));
  CHECK_THAT(adam_error<loom::adamw>({.beta1 = 2.0f}), Equals("loom::adamw: option beta1 must be in [0, 1), but is 2"));
  CHECK_THAT(adam_error<loom::adamw>({.beta2 = 1.0f}), Equals("loom::adamw: option beta2 must be in [0, 1), but is 1"));
  CHECK_THAT(adam_error<loom::adamw>({.eps = NAN}), Equals("loom::adamw: option eps must be finite and > 0, but is nan"));
  CHECK_THAT(adam_error<loom::adamw>({.weight_decay = -0.01f}),
             Equals("loom::adamw: option weight_decay must be finite and >= 0, but is -0.01"));
}

TEST_CASE("step() rejects a parameter count other than the state's and a negative learning rate", "[optim]") {
  std::vector<float> p(7), g(7);
  loom::sgd::state<float, loom::cpu> sgd({}, 7);
  CHECK_THAT(message_of([&] { sgd.step(p.data(), g.data(), 6, 0.1f); }),
             Equals("loom::sgd: step() was given 6 parameters, but the state was built for 7"));
  CHECK_THAT(message_of([&] { sgd.step(p.data(), g.data(), 7, -1.0f); }),
             Equals("loom::sgd: the learning rate passed to step() must be finite and >= 0, but is -1"));
  loom::adam::state<float, loom::cpu> adam({}, 7);
  CHECK_THAT(message_of([&] { adam.step(p.data(), g.data(), 8, 0.1f); }),
             Equals("loom::adam: step() was given 8 parameters, but the state was built for 7"));
  loom::adamw::state<float, loom::cpu> adamw({}, 7);
  CHECK_THAT(message_of([&] { adamw.step(p.data(), g.data(), 7, NAN); }),
             Equals("loom::adamw: the learning rate passed to step() must be finite and >= 0, but is nan"));
  CHECK(adam.steps() == 0);
  CHECK(adamw.steps() == 0);
}
