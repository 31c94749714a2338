// SPDX-License-Identifier: Apache-2.0
// step_part / end_step (what loom::shard_optimizer_state steps a rank's slices with): a step
// taken as parts in any order, each against its own range of the state, is bitwise step() over
// the whole buffer — SGD (plain, momentum, Nesterov, weight decay), Adam and AdamW over several
// steps — and a range outside the state is refused with the numbers.

#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/core/error.hpp"
#include "loom/optim.hpp"

namespace {

template <class Optimizer>
void parts_are_the_whole(const typename Optimizer::options& o) {
  constexpr std::size_t n = 100003;  // large enough for the threaded path
  std::vector<float> p(n), q(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = q[i] = 0.01f * static_cast<float>((i * 37) % 201) - 1.0f;
    g[i] = 0.001f * static_cast<float>((i * 91) % 301) - 0.15f;
  }
  typename Optimizer::template state<float, loom::cpu> whole(o, n), parts(o, n);
  // Parts of different sizes, taken out of order, the last an empty one.
  const std::size_t cuts[] = {0, 1, 7, 50000, 50001, n};
  const std::size_t order[] = {3, 0, 4, 2, 1};
  for (int step = 0; step < 4; ++step) {
    const float lr = 0.05f / static_cast<float>(step + 1);
    whole.step(p.data(), g.data(), n, lr);
    for (const std::size_t k : order)
      parts.step_part(q.data() + cuts[k], g.data() + cuts[k], cuts[k], cuts[k + 1] - cuts[k], lr);
    parts.step_part(q.data() + n, g.data() + n, n, 0, lr);
    parts.end_step();
  }
  CHECK(parts.steps() == whole.steps());
  CHECK(p == q);
  const auto a = whole.buffers(), b = parts.buffers();
  CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
}

}  // namespace

TEST_CASE("step_part over every range, then end_step, is bitwise step()", "[optim][zero]") {
  parts_are_the_whole<loom::sgd>({.lr = 0.1f});
  parts_are_the_whole<loom::sgd>({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f});
  parts_are_the_whole<loom::sgd>({.lr = 0.1f, .momentum = 0.9f, .nesterov = true});
  parts_are_the_whole<loom::adam>({.lr = 1e-3f, .weight_decay = 1e-4f});
  parts_are_the_whole<loom::adamw>({.lr = 1e-3f});
}

TEST_CASE("step_part refuses a range outside the state", "[optim][zero]") {
  std::vector<float> p(10), g(10);
  loom::adam::state<float, loom::cpu> s({}, 10);
  CHECK_THROWS_WITH(s.step_part(p.data(), g.data(), 8, 3, 0.1f),
                    "loom::adam: step_part() was given values [8, 11), but the state holds 10");
  loom::sgd::state<float, loom::cpu> t({.lr = 0.1f, .momentum = 0.5f}, 10);
  CHECK_THROWS_WITH(t.step_part(p.data(), g.data(), 11, 0, 0.1f),
                    "loom::sgd: step_part() was given values [11, 11), but the state holds 10");
  CHECK_THROWS_AS(t.step_part(p.data(), g.data(), 0, 10, -1.0f), loom::invalid_argument);
}
