// SPDX-License-Identifier: Apache-2.0
// Tests of the learning-rate schedules against values worked out by hand, of loom::lr_schedule,
// and of every schedule's argument checks.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <string>

#include "loom/optim/schedule.hpp"

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

}  // namespace

TEST_CASE("constant_lr returns the base rate at every step", "[optim][schedule]") {
  const loom::constant_lr s;
  CHECK(s(0, 0.1f) == 0.1f);
  CHECK(s(123456, 0.1f) == 0.1f);
}

TEST_CASE("step_lr multiplies by gamma every step_size steps", "[optim][schedule]") {
  const loom::step_lr s{.step_size = 3, .gamma = 0.5f};
  CHECK(s(0, 0.1f) == 0.1f);
  CHECK(s(2, 0.1f) == 0.1f);
  CHECK(s(3, 0.1f) == 0.05f);
  CHECK(s(5, 0.1f) == 0.05f);
  CHECK(s(6, 0.1f) == 0.025f);
  CHECK(s(30, 1.0f) == std::ldexp(1.0f, -10));
  const loom::step_lr tenth{.step_size = 1, .gamma = 0.1f};
  CHECK(tenth(2, 1.0f) == Approx(0.01).epsilon(1e-6));
}

TEST_CASE("cosine_warmup rises linearly, then follows a half cosine down to min_lr and stays there",
          "[optim][schedule]") {
  const loom::cosine_warmup s{.warmup_steps = 4, .total_steps = 12};
  // warm-up: base * (s + 1) / 4
  CHECK(s(0, 1.0f) == 0.25f);
  CHECK(s(1, 1.0f) == 0.5f);
  CHECK(s(2, 1.0f) == 0.75f);
  CHECK(s(3, 1.0f) == 1.0f);
  // cosine over steps 4..11 with q = (s - 4) / 8
  CHECK(s(4, 1.0f) == 1.0f);
  CHECK(s(6, 1.0f) == Approx(0.8535533905932737).epsilon(1e-7));  // (1 + cos(pi/4)) / 2
  CHECK(s(8, 1.0f) == Approx(0.5).epsilon(1e-7));
  CHECK(s(11, 1.0f) == Approx(0.0380602337443566).epsilon(1e-6));  // (1 + cos(7 pi/8)) / 2
  CHECK(s(12, 1.0f) == 0.0f);
  CHECK(s(1000, 1.0f) == 0.0f);
  CHECK(s(1, 0.2f) == Approx(0.1).epsilon(1e-7));
}

TEST_CASE("cosine_warmup decays to a non-zero min_lr", "[optim][schedule]") {
  const loom::cosine_warmup s{.warmup_steps = 4, .total_steps = 12, .min_lr = 0.1f};
  CHECK(s(0, 1.0f) == 0.25f);
  CHECK(s(4, 1.0f) == 1.0f);
  CHECK(s(8, 1.0f) == Approx(0.55).epsilon(1e-7));
  CHECK(s(12, 1.0f) == 0.1f);
  CHECK(s(99, 1.0f) == 0.1f);
}

TEST_CASE("cosine_warmup without warm-up starts at the base rate", "[optim][schedule]") {
  const loom::cosine_warmup s{.warmup_steps = 0, .total_steps = 2};
  CHECK(s(0, 0.5f) == 0.5f);
  CHECK(s(1, 0.5f) == Approx(0.25).epsilon(1e-7));
  CHECK(s(2, 0.5f) == 0.0f);
}

TEST_CASE("cosine_warmup that is all warm-up holds min_lr after it", "[optim][schedule]") {
  const loom::cosine_warmup s{.warmup_steps = 2, .total_steps = 2, .min_lr = 0.01f};
  CHECK(s(0, 1.0f) == 0.5f);
  CHECK(s(1, 1.0f) == 1.0f);
  CHECK(s(2, 1.0f) == 0.01f);
}

TEST_CASE("lr_schedule defaults to constant and holds any schedule or callable", "[optim][schedule]") {
  const loom::lr_schedule by_default;
  CHECK(by_default(7, 0.3f) == 0.3f);
  const loom::lr_schedule stepped = loom::step_lr{.step_size = 2, .gamma = 0.5f};
  CHECK(stepped(2, 1.0f) == 0.5f);
  const loom::lr_schedule cosine = loom::cosine_warmup{.warmup_steps = 1, .total_steps = 3};
  CHECK(cosine(0, 1.0f) == 1.0f);
  const loom::lr_schedule lambda = [](std::size_t step, float base) { return base / static_cast<float>(step + 1); };
  CHECK(lambda(3, 1.0f) == 0.25f);
  const loom::lr_schedule copy = stepped;
  CHECK(copy(4, 1.0f) == 0.25f);

  struct options {
    float lr = 0.1f;
    loom::lr_schedule schedule = loom::constant_lr{};
  };
  const options o{.schedule = loom::step_lr{.step_size = 1, .gamma = 0.5f}};
  CHECK(o.schedule(1, o.lr) == 0.05f);
}

TEST_CASE("step_lr rejects a zero step_size and a gamma that is not positive", "[optim][schedule]") {
  CHECK_THAT(message_of([] { (void)loom::step_lr{.step_size = 0, .gamma = 0.5f}(0, 1.0f); }),
             Equals("loom::step_lr: step_size must be > 0, but is 0"));
  CHECK_THAT(message_of([] { (void)loom::step_lr{.step_size = 5, .gamma = 0.0f}(0, 1.0f); }),
             Equals("loom::step_lr: gamma must be finite and > 0, but is 0"));
  CHECK_THAT(message_of([] { (void)loom::step_lr{.step_size = 5, .gamma = -2.0f}(0, 1.0f); }),
             Equals("loom::step_lr: gamma must be finite and > 0, but is -2"));
  CHECK_THAT(message_of([] { (void)loom::step_lr{.step_size = 5, .gamma = NAN}(0, 1.0f); }),
             Equals("loom::step_lr: gamma must be finite and > 0, but is nan"));
}

TEST_CASE("cosine_warmup rejects zero total_steps, warm-up past the end and a negative min_lr", "[optim][schedule]") {
  CHECK_THAT(message_of([] { (void)loom::cosine_warmup{.warmup_steps = 0, .total_steps = 0}(0, 1.0f); }),
             Equals("loom::cosine_warmup: total_steps must be > 0, but is 0"));
  CHECK_THAT(message_of([] { (void)loom::cosine_warmup{.warmup_steps = 11, .total_steps = 10}(0, 1.0f); }),
             Equals("loom::cosine_warmup: warmup_steps must be <= total_steps (10), but is 11"));
  CHECK_THAT(
      message_of([] { (void)loom::cosine_warmup{.warmup_steps = 1, .total_steps = 10, .min_lr = -0.5f}(0, 1.0f); }),
      Equals("loom::cosine_warmup: min_lr must be finite and >= 0, but is -0.5"));
}

TEST_CASE("lr_schedule checks a schedule when it is stored, before any step", "[optim][schedule]") {
  CHECK_THAT(message_of([] { loom::lr_schedule s = loom::step_lr{.step_size = 0, .gamma = 0.5f}; }),
             Equals("loom::step_lr: step_size must be > 0, but is 0"));
  CHECK_THAT(message_of([] { loom::lr_schedule s = loom::cosine_warmup{.warmup_steps = 3, .total_steps = 2}; }),
             Equals("loom::cosine_warmup: warmup_steps must be <= total_steps (2), but is 3"));
}
