// SPDX-License-Identifier: Apache-2.0
#pragma once
// Adam (L2 weight decay added to the gradient, as torch.optim.Adam) and AdamW (decoupled weight
// decay, as torch.optim.AdamW), over one flat parameter buffer. amsgrad is not offered. The
// arithmetic is the adam_update body in backend/kernels/optim.hpp; this file holds options,
// state, step counting and bias correction.

#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "loom/backend/kernels/optim.hpp"
#include "loom/core/memory.hpp"
#include "loom/optim/decay_exempt.hpp"
#include "loom/optim/validate.hpp"

namespace loom {

namespace detail {

/// The state shared by adam and adamw; Optimizer is the tag (adam or adamw), which supplies
/// options, name and whether weight decay is decoupled.
template <class Optimizer, class T, class Backend>
class adam_state {
 public:
  using options = typename Optimizer::options;

  adam_state(const options& o, std::size_t n)
      : opts_(o), size_(n), moments_(Optimizer::state_values_per_parameter(o) * n) {
    const char* who = Optimizer::qualified_name;
    require_in_range(positive_finite(o.lr), who, "option lr", "finite and > 0", o.lr);
    require_in_range(unit_interval_open_right(o.beta1), who, "option beta1", "in [0, 1)", o.beta1);
    require_in_range(unit_interval_open_right(o.beta2), who, "option beta2", "in [0, 1)", o.beta2);
    require_in_range(positive_finite(o.eps), who, "option eps", "finite and > 0", o.eps);
    require_in_range(non_negative_finite(o.weight_decay), who, "option weight_decay", "finite and >= 0",
                     o.weight_decay);
  }

  void step(T* params, const T* grads, std::size_t n, float lr) {
    check_step_arguments(Optimizer::qualified_name, n, size_, lr);
    step_part(params, grads, 0, n, lr);
    end_step();
  }

  /// Part of step t = steps() + 1 (loom::shard_optimizer_state steps a rank's slices where
  /// they lie): params and grads (n elements) against state elements [offset, offset + n);
  /// end_step() closes the step. step() is step_part over everything and end_step().
  void step_part(T* params, const T* grads, std::size_t offset, std::size_t n, float lr) {
    check_step_part(Optimizer::qualified_name, offset, n, size_, lr);
    // Host-side scalars in double, as PyTorch computes them in Python floats.
    const double t = static_cast<double>(steps_ + 1);
    const double beta1 = opts_.beta1;
    const double beta2 = opts_.beta2;
    const double wd = opts_.weight_decay;
    const double bias_correction1 = 1.0 - std::pow(beta1, t);
    const double bias_correction2 = 1.0 - std::pow(beta2, t);
    const double step_size = static_cast<double>(lr) / bias_correction1;
    const double decay_factor = Optimizer::decoupled ? 1.0 - static_cast<double>(lr) * wd : 1.0;
    const double l2 = Optimizer::decoupled ? 0.0 : wd;
    // A run without decay (decay_norm_and_bias = false): l2 0 and factor 1, as weight_decay 0.
    auto run = [&](std::size_t from, std::size_t count, bool decay) {
      const detail::adam_update<T> body{params + from,
                                        grads + from,
                                        moments_.data() + offset + from,
                                        moments_.data() + size_ + offset + from,
                                        static_cast<T>(beta1),
                                        static_cast<T>(beta2),
                                        static_cast<T>(1.0 - beta1),
                                        static_cast<T>(1.0 - beta2),
                                        static_cast<T>(opts_.eps),
                                        static_cast<T>(decay ? l2 : 0.0),
                                        static_cast<T>(decay ? decay_factor : 1.0),
                                        static_cast<T>(step_size),
                                        static_cast<T>(std::sqrt(bias_correction2))};
      Backend::for_each(count, body);
    };
    if (wd != 0.0 && !opts_.decay_norm_and_bias) {
      if (!exempt_.given()) throw_no_decay_exemption(Optimizer::qualified_name);
      exempt_.for_each_run(offset, n, run);
    } else {
      run(0, n, true);
    }
  }
  void end_step() noexcept { ++steps_; }

  /// The state elements that get no weight decay when decay_norm_and_bias is false.
  void set_decay_exempt(std::vector<index_range> ranges) { exempt_.set(std::move(ranges)); }
  const std::vector<index_range>& decay_exempt() const noexcept { return exempt_.ranges(); }

  const options& opts() const noexcept { return opts_; }
  std::span<T> buffers() noexcept { return {moments_.data(), moments_.size()}; }
  std::span<const T> buffers() const noexcept { return {moments_.data(), moments_.size()}; }
  std::size_t steps() const noexcept { return steps_; }
  void set_steps(std::size_t s) noexcept { steps_ = s; }

 private:
  options opts_;
  std::size_t size_;
  buffer<T, typename Backend::memory_space> moments_;  // (2, n): exp_avg then exp_avg_sq
  std::size_t steps_ = 0;
  decay_exemption exempt_;
};

}  // namespace detail

/// Adam (Kingma & Ba), as torch.optim.Adam with amsgrad off; weight_decay is an L2 term added to
/// the gradient before the moments. For step t (from 1):
///   g += weight_decay * p;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
///   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
struct adam {
  /// Hyper-parameters. lr is the base learning rate a schedule scales.
  struct options {
    float lr = 1e-3f;           ///< base learning rate, > 0
    float beta1 = 0.9f;         ///< first-moment decay, in [0, 1)
    float beta2 = 0.999f;       ///< second-moment decay, in [0, 1)
    float eps = 1e-8f;          ///< added to the denominator, > 0
    float weight_decay = 0.0f;  ///< L2 penalty added to the gradient (torch.optim.Adam), >= 0
    /// true: weight_decay on every parameter (torch.optim.Adam). false: none on the weight and
    /// bias of batch_norm and layer_norm nor on any layer's bias (torchvision's
    /// --norm-weight-decay 0 --bias-weight-decay 0); loom::trainer finds them in the network.
    bool decay_norm_and_bias = true;
  };
  static constexpr const char* name = "adam";
  /// Names of the state buffers (each laid out as the parameters), as torch.optim.Adam's state
  /// calls them. Checkpoints use them.
  static constexpr const char* buffer_names[] = {"exp_avg", "exp_avg_sq"};
  static constexpr const char* qualified_name = "loom::adam";
  /// Values of state per parameter: exp_avg and exp_avg_sq (loom::memory_plan counts by it).
  static constexpr std::size_t state_values_per_parameter(const options&) noexcept { return 2; }
  static constexpr bool decoupled = false;

  /// The optimizer state for n parameters of type T in Backend's memory space: the first and
  /// second moments (zero-initialised) and the step counter.
  ///   state(o, n): checks o; throws loom::invalid_argument naming the option, expected range
  ///                and value found.
  ///   step(params, grads, n, lr): one update at the scheduled learning rate lr; requires n as
  ///                built and lr finite and >= 0 (throws loom::invalid_argument otherwise).
  ///   opts(): the options; buffers(): exp_avg (n) then exp_avg_sq (n) as one flat span;
  ///   steps() / set_steps(s): the step counter bias correction uses (for checkpoints).
  template <class T, class Backend>
  using state = detail::adam_state<adam, T, Backend>;
};

/// AdamW (Loshchilov & Hutter), as torch.optim.AdamW with amsgrad off; weight decay is decoupled
/// from the gradient and scaled by the scheduled learning rate. For step t (from 1):
///   p *= 1 - lr * weight_decay;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
///   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
struct adamw {
  /// Hyper-parameters. lr is the base learning rate a schedule scales.
  struct options {
    float lr = 1e-3f;            ///< base learning rate, > 0
    float beta1 = 0.9f;          ///< first-moment decay, in [0, 1)
    float beta2 = 0.999f;        ///< second-moment decay, in [0, 1)
    float eps = 1e-8f;           ///< added to the denominator, > 0
    float weight_decay = 1e-2f;  ///< decoupled decay (torch.optim.AdamW), >= 0
    /// As adam::options::decay_norm_and_bias (false: no decoupled decay on norms and biases).
    bool decay_norm_and_bias = true;
  };
  static constexpr const char* name = "adamw";
  static constexpr const char* buffer_names[] = {"exp_avg", "exp_avg_sq"};
  static constexpr const char* qualified_name = "loom::adamw";
  /// Values of state per parameter: exp_avg and exp_avg_sq (loom::memory_plan counts by it).
  static constexpr std::size_t state_values_per_parameter(const options&) noexcept { return 2; }
  static constexpr bool decoupled = true;

  /// The optimizer state; the same interface as adam::state.
  template <class T, class Backend>
  using state = detail::adam_state<adamw, T, Backend>;
};

}  // namespace loom
