// SPDX-License-Identifier: Apache-2.0
#pragma once
// Learning-rate schedules: functions of (step, base_lr) -> the rate for that step, where step
// counts optimizer steps from 0. loom::lr_schedule holds any of them (or any callable of that
// signature) with constant_lr as its default, so a trainer's options can carry one by value.

#include <cmath>
#include <cstddef>
#include <concepts>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "loom/optim/validate.hpp"

namespace loom {

/// The base learning rate at every step.
struct constant_lr {
  float operator()(std::size_t /*step*/, float base_lr) const noexcept { return base_lr; }
};

/// base_lr * gamma^floor(step / step_size), as torch.optim.lr_scheduler.StepLR.
/// Requires: step_size > 0; gamma finite and > 0. Throws loom::invalid_argument otherwise (on
/// validate(), on each call, and when put into a loom::lr_schedule).
struct step_lr {
  std::size_t step_size;
  float gamma;

  void validate() const {
    detail::require_in_range(step_size > 0, "loom::step_lr", "step_size", "> 0", static_cast<double>(step_size));
    detail::require_in_range(detail::positive_finite(gamma), "loom::step_lr", "gamma", "finite and > 0", gamma);
  }
  float operator()(std::size_t step, float base_lr) const {
    validate();
    const double k = static_cast<double>(step / step_size);
    return static_cast<float>(static_cast<double>(base_lr) * std::pow(static_cast<double>(gamma), k));
  }
};

/// Linear warm-up, then cosine decay to min_lr, then min_lr:
///   step s < warmup_steps:           base_lr * (s + 1) / warmup_steps
///   warmup_steps <= s < total_steps: min_lr + (base_lr - min_lr) * (1 + cos(pi * q)) / 2,
///                                    q = (s - warmup_steps) / (total_steps - warmup_steps)
///   s >= total_steps:                min_lr
/// So the last warm-up step and the first cosine step both run at base_lr, and the rate reaches
/// min_lr after total_steps. warmup_steps = 0 gives plain cosine annealing.
/// Requires: total_steps > 0; warmup_steps <= total_steps; min_lr finite and >= 0.
/// Throws loom::invalid_argument otherwise (on validate(), on each call, and when put into a
/// loom::lr_schedule).
struct cosine_warmup {
  std::size_t warmup_steps;
  std::size_t total_steps;
  float min_lr = 0;

  void validate() const {
    constexpr const char* who = "loom::cosine_warmup";
    detail::require_in_range(total_steps > 0, who, "total_steps", "> 0", static_cast<double>(total_steps));
    if (warmup_steps > total_steps)
      detail::throw_out_of_range(who, "warmup_steps", ("<= total_steps (" + std::to_string(total_steps) + ")").c_str(),
                                 std::to_string(warmup_steps));
    detail::require_in_range(detail::non_negative_finite(min_lr), who, "min_lr", "finite and >= 0", min_lr);
  }
  float operator()(std::size_t step, float base_lr) const {
    validate();
    const double base = base_lr;
    if (step < warmup_steps)
      return static_cast<float>(base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps));
    if (step >= total_steps) return min_lr;
    const double q =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    const double pi = 3.141592653589793;
    const double lo = min_lr;
    return static_cast<float>(lo + (base - lo) * 0.5 * (1.0 + std::cos(pi * q)));
  }
};

/// Any learning-rate schedule: a callable float(std::size_t step, float base_lr), constant_lr by
/// default. A schedule with a validate() member is checked when it is stored, so a bad schedule
/// fails where the options are written, not at the first step.
class lr_schedule {
 public:
  lr_schedule() : f_(constant_lr{}) {}
  /// Throws: whatever s.validate() throws (loom::invalid_argument for loom's schedules).
  template <class S>
    requires(!std::same_as<std::remove_cvref_t<S>, lr_schedule> &&
             std::is_invocable_r_v<float, const std::remove_cvref_t<S>&, std::size_t, float>)
  lr_schedule(S&& s) {  // NOLINT(google-explicit-constructor): options read `.schedule = loom::step_lr{...}`
    if constexpr (requires { s.validate(); }) s.validate();
    f_ = std::forward<S>(s);
  }
  /// The learning rate for step `step` (from 0) given the base rate.
  float operator()(std::size_t step, float base_lr) const { return f_(step, base_lr); }

 private:
  std::function<float(std::size_t, float)> f_;
};

}  // namespace loom
