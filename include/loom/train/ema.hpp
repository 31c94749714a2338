// SPDX-License-Identifier: Apache-2.0
#pragma once
// The EMA of the weights over a fit (trainer_options::ema, loom/train/ema_state.hpp), a step
// observer: after each optimizer step that is due, this rank's parameters and buffers are
// copied to host memory (the engine completes ZeRO's gathers first) and averaged into the run's
// ema_state. It runs before the checkpoint schedule, so that a checkpoint at a step holds that
// step's EMA.

#include <vector>

#include "loom/core/step_observer.hpp"
#include "loom/train/erased_engine.hpp"
#include "loom/train/run_state.hpp"

namespace loom::detail {

/// Updates `s` after the optimizer steps that are due (see ema_options).
class ema_tracker final : public step_observer {
 public:
  ema_tracker(erased_engine& e, ema_state& s) : e_(e), s_(s) {}

  bool after_step(const step_point& p) override {
    if (!s_.due(p.step)) return true;
    weights_.resize(s_.values.size());
    e_.parameters_to_host(weights_.data());
    if (s_.values.size() > s_.params) e_.buffers_to_host(weights_.data() + s_.params);
    s_.update(p.step, weights_.data());
    return true;
  }

 private:
  erased_engine& e_;
  ema_state& s_;
  std::vector<float> weights_;  // the weights in host memory, reused
};

}  // namespace loom::detail
