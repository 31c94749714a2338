// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where a trainer's run is, as its fit loop, its checkpoints and its recoveries share it: the
// steps taken, the position in the data (fit_position), the last fit's options as a checkpoint
// records them, and what the last failure left to report. Plain data, no type of the trainer's.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "loom/core/fault.hpp"
#include "loom/core/step_observer.hpp"
#include "loom/train/ema_state.hpp"

namespace loom::detail {

/// A place in the run: the epoch in progress, the global batches of it taken, and its loss sums
/// so far (this rank's, as the fit loop keeps them).
struct fit_position {
  bool valid = false;
  std::size_t epoch = 0, batch = 0, batches = 0;
  loss_sums sums{};

  /// Where to continue from here (an epoch that had just ended: the next one's start).
  fit_position next() const {
    if (valid && batch >= batches) return {.valid = true, .epoch = epoch + 1};
    return *this;
  }
};

/// The options of the last fit (what a checkpoint records of them).
struct fit_record {
  std::size_t batch = 0, accumulation = 1, epochs = 0, max_steps = 0, deterministic_chunk = 0;
  double clip_grad_norm = 0;
  std::size_t samples = 0;
};

/// The run of one trainer (see the file comment).
struct run_state {
  std::size_t step = 0;     ///< optimizer steps taken, over every fit
  float last_lr = 0;        ///< the learning rate of the last step
  fit_position at{};        ///< after the last finished step
  fit_position resume{};    ///< where the next fit starts (a checkpoint was loaded)
  fit_record last_fit{};    ///< the options of the last fit
  std::string data_identity;  ///< data::identity_of the training set of the last fit
  /// The loss sums are the whole batch's on every rank, step by step (failure detection, or
  /// a rank holding samples but no loss): a survivor's position has them without a collective.
  bool global_sums = false;
  /// What a replacement of a lost rank must share with the survivors: the trainer's job and
  /// the fit's options, as the ranks compare them.
  std::string joined_description;
  /// Failure detection is on in this fit.
  bool watching = false;
  /// Where the last rank_failure found this rank.
  fault_marker failed_at{};
  /// The ranks the recovery in progress left out, named.
  std::string interrupted_lost;
  /// The last replacement's spawn, until its first good step.
  std::optional<std::chrono::steady_clock::time_point> replacement_began;
  /// The EMA of the weights (trainer_options::ema; off: ema.on() is false).
  ema_state ema{};
};

/// What the survivor ahead sends of the run with its state after a recovery (and the survivors
/// to a replacement): the steps, the optimizer's step count, the position and the learning rate.
struct run_head {
  std::size_t step = 0, optimizer_steps = 0;
  fit_position at{};
  float lr = 0;

  /// As the doubles a broadcast carries, and back (every rank runs the same program).
  static constexpr std::size_t values = 10;
  std::array<double, values> pack() const {
    return {static_cast<double>(step), static_cast<double>(optimizer_steps), static_cast<double>(at.valid),
            static_cast<double>(at.epoch), static_cast<double>(at.batch), static_cast<double>(at.batches),
            at.sums.loss, at.sums.correct, at.sums.samples, static_cast<double>(lr)};
  }
  static run_head unpack(const std::array<double, values>& v) {
    return {.step = static_cast<std::size_t>(v[0]), .optimizer_steps = static_cast<std::size_t>(v[1]),
            .at = {.valid = v[2] != 0, .epoch = static_cast<std::size_t>(v[3]), .batch = static_cast<std::size_t>(v[4]),
                   .batches = static_cast<std::size_t>(v[5]), .sums = {v[6], v[7], v[8]}},
            .lr = static_cast<float>(v[9])};
  }
};

}  // namespace loom::detail
