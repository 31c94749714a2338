// SPDX-License-Identifier: Apache-2.0
#pragma once
// An exponential moving average of the weights (trainer_options::ema; docs/trainer.md, "An EMA
// of the weights"): its options (loom::ema_options) and what a trainer keeps of it
// (detail::ema_state, plain data in host memory, part of the run's state: detail::run_state).
// The step observer that updates it is loom/train/ema.hpp; checkpoints write it beside the
// model (docs/checkpoints.md), a recovery's state broadcast carries it (train/recovery.hpp).
//
// The semantics are torchvision's (references/classification, --model-ema: AveragedModel with
// use_buffers=True): every `every` optimizer steps, ema = decay * ema + (1 - decay) * weights,
// in float, over the parameters and the buffers (batch norm's running statistics); an int64
// count (num_batches_tracked) is averaged as a float and truncated toward zero, as torch's
// copy_ into an int64 tensor does. The first update copies the weights (n_averaged == 0).

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/core/error.hpp"

namespace loom {

/// The exponential moving average of the weights a trainer keeps (trainer_options::ema).
/// decay = 0: none. The EMA is updated after optimizer steps 1, 1 + every, 1 + 2 * every, ...
/// (counted over the run, every fit alike), as ema = decay * ema + (1 - decay) * weights; the
/// first update copies the weights. `decay` is applied as given, per update: torchvision's
/// train.py adjusts its --model-ema-decay first (ema_options::torchvision does the same).
/// While the step is at most warmup_steps every update copies the weights (torchvision's
/// n_averaged.fill_(0) during --lr-warmup-epochs: warm-up epochs times the steps per epoch).
struct ema_options {
  /// The decay per update, in [0, 1); 0: no EMA.
  double decay = 0;
  /// Optimizer steps between updates, at least 1.
  std::size_t every = 1;
  /// Updates at optimizer steps up to this one copy the weights (0: none).
  std::size_t warmup_steps = 0;

  /// torchvision's --model-ema-decay D with --model-ema-steps `every`, a global batch of
  /// `batch` samples and `epochs` epochs, adjusted as its train.py does:
  /// alpha = min(1, (1 - D) * batch * every / epochs), decay = 1 - alpha.
  static ema_options torchvision(double decay, std::size_t batch, std::size_t every, std::size_t epochs,
                                 std::size_t warmup_steps = 0) {
    if (epochs == 0) throw invalid_argument("loom::ema_options::torchvision: epochs must be at least 1, got 0");
    double alpha = (1.0 - decay) * static_cast<double>(batch) * static_cast<double>(every) / static_cast<double>(epochs);
    if (alpha > 1.0) alpha = 1.0;
    return {.decay = 1.0 - alpha, .every = every, .warmup_steps = warmup_steps};
  }
};

namespace detail {

/// Throws loom::invalid_argument, with a sentence, for options no EMA can have.
inline void check_ema_options(const ema_options& o) {
  if (!(o.decay >= 0.0 && o.decay < 1.0))
    throw invalid_argument("loom::trainer_options::ema: decay must be in [0, 1) (0: no EMA), got " +
                           std::to_string(o.decay));
  if (o.every == 0)
    throw invalid_argument("loom::trainer_options::ema: every must be at least 1 (an update every so many optimizer "
                           "steps), got 0");
}

/// A trainer's EMA of the weights (see the file comment): this rank's parameters then its
/// buffers, laid out as the engine holds them (the whole model's: the EMA runs where every rank
/// holds whole replicas), in host memory.
struct ema_state {
  ema_options opts{};
  std::vector<float> values;       ///< the parameters' EMA, then the buffers'
  std::size_t params = 0;          ///< how many of values are parameters
  std::vector<std::size_t> counts; ///< the indices in values of int64 counts (num_batches_tracked)
  std::size_t updates = 0;         ///< torchvision's n_averaged: 0, the next update copies
  bool valid = false;              ///< values hold an EMA (an update, or a checkpoint, set them)

  bool on() const noexcept { return opts.decay > 0; }
  /// Whether step `step` (steps taken, this one included) ends with an update.
  bool due(std::size_t step) const noexcept { return on() && step > 0 && (step - 1) % opts.every == 0; }

  /// The update after optimizer step `step`, from the weights w (values.size() of them, laid out
  /// as values).
  void update(std::size_t step, const float* w) {
    if (updates == 0) {
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = w[i];
    } else {
      const float d = static_cast<float>(opts.decay), c = static_cast<float>(1.0 - opts.decay);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = average(values[i], w[i], d, c);
      for (std::size_t i : counts) values[i] = std::trunc(values[i]);
    }
    ++updates;
    if (step <= opts.warmup_steps) updates = 0;
    valid = true;
  }
  /// decay * ema + (1 - decay) * w, in float, as torch computes it (two products, one sum).
  static float average(float ema, float w, float d, float c) {
    const float a = d * ema;
    const float b = c * w;
    return a + b;
  }
};

}  // namespace detail
}  // namespace loom
