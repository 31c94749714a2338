// SPDX-License-Identifier: Apache-2.0
#pragma once
// Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay, over one
// flat parameter buffer, with torch.optim.SGD's semantics (dampening 0). The arithmetic is the
// sgd_update body in backend/kernels/optim.hpp; this file holds options, state and checks.

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "loom/backend/kernels/optim.hpp"
#include "loom/core/memory.hpp"
#include "loom/optim/decay_exempt.hpp"
#include "loom/optim/validate.hpp"

namespace loom {

/// Stochastic gradient descent, as torch.optim.SGD with dampening 0:
///   d = g + weight_decay * p;  buf = momentum * buf + d (buf = d on the first step);
///   p -= lr * (nesterov ? d + momentum * buf : buf)     (p -= lr * d without momentum).
struct sgd {
  /// Hyper-parameters. lr is the base learning rate a schedule scales.
  struct options {
    float lr = 0.01f;            ///< base learning rate, > 0
    float momentum = 0.0f;       ///< in [0, 1); 0 disables the momentum buffer
    bool nesterov = false;       ///< Nesterov momentum; requires momentum > 0
    float weight_decay = 0.0f;   ///< L2 penalty added to the gradient, >= 0
    /// true: weight_decay on every parameter (torch.optim.SGD). false: none on the weight and
    /// bias of batch_norm and layer_norm nor on any layer's bias (torchvision's
    /// --norm-weight-decay 0 --bias-weight-decay 0); loom::trainer finds them in the network.
    bool decay_norm_and_bias = true;
  };
  static constexpr const char* name = "sgd";
  /// Names of the state buffers (each laid out as the parameters), as torch.optim.SGD's state
  /// calls them: the momentum buffer, present when momentum > 0. Checkpoints use them.
  static constexpr const char* buffer_names[] = {"momentum_buffer"};
  /// Values of state per parameter that state(o, n) allocates: the momentum buffer (1) when
  /// o.momentum > 0, else none. loom::memory_plan counts the optimizer state by it.
  static constexpr std::size_t state_values_per_parameter(const options& o) noexcept { return o.momentum > 0 ? 1 : 0; }

  /// The optimizer state for n parameters of type T whose memory lives in Backend's space.
  template <class T, class Backend>
  class state {
   public:
    /// Checks the options and allocates the momentum buffer (n elements, zero) when momentum > 0.
    /// Throws: loom::invalid_argument naming the option, its expected range and the value found.
    state(const options& o, std::size_t n) : opts_(o), size_(n) {
      constexpr const char* who = "loom::sgd";
      detail::require_in_range(detail::positive_finite(o.lr), who, "option lr", "finite and > 0", o.lr);
      detail::require_in_range(detail::unit_interval_open_right(o.momentum), who, "option momentum", "in [0, 1)",
                               o.momentum);
      if (o.nesterov && !(o.momentum > 0))
        detail::throw_out_of_range(who, "option momentum", "> 0 when nesterov is true",
                                   detail::format_number(o.momentum));
      detail::require_in_range(detail::non_negative_finite(o.weight_decay), who, "option weight_decay",
                               "finite and >= 0", o.weight_decay);
      if (const std::size_t k = state_values_per_parameter(o)) velocity_ = buffer<T, typename Backend::memory_space>(k * n);
    }

    /// One update of params (n elements) with grads, at learning rate lr (the scheduled rate for
    /// this step, not necessarily opts().lr). params and grads live in Backend's memory space.
    /// Requires: n equals the n given at construction; lr finite and >= 0.
    /// Throws: loom::invalid_argument when either does not hold.
    void step(T* params, const T* grads, std::size_t n, float lr) {
      detail::check_step_arguments("loom::sgd", n, size_, lr);
      step_part(params, grads, 0, n, lr);
      end_step();
    }

    /// Part of one step (loom::shard_optimizer_state steps a rank's slices where they lie):
    /// params and grads (n elements) against state elements [offset, offset + n); end_step()
    /// closes the step. step() is step_part over everything and end_step().
    /// With decay_norm_and_bias = false and weight_decay > 0, the state elements set_decay_exempt
    /// named step without decay (throws loom::invalid_argument when none were given).
    void step_part(T* params, const T* grads, std::size_t offset, std::size_t n, float lr) {
      detail::check_step_part("loom::sgd", offset, n, size_, lr);
      const bool decay = opts_.weight_decay != 0.0f;
      if (decay && !opts_.decay_norm_and_bias) {
        if (!exempt_.given()) detail::throw_no_decay_exemption("loom::sgd");
        exempt_.for_each_run(offset, n, [&](std::size_t from, std::size_t count, bool d) {
          step_run(params + from, grads + from, offset + from, count, lr, d);
        });
      } else {
        step_run(params, grads, offset, n, lr, decay);
      }
    }
    void end_step() noexcept { ++steps_; }

    /// The state elements that get no weight decay when decay_norm_and_bias is false (their
    /// offsets in this state: the parameters', or the shard's under ZeRO).
    void set_decay_exempt(std::vector<index_range> ranges) { exempt_.set(std::move(ranges)); }
    const std::vector<index_range>& decay_exempt() const noexcept { return exempt_.ranges(); }

    /// The options this state was built with.
    const options& opts() const noexcept { return opts_; }
    /// The momentum buffer as one flat span of n elements; empty without momentum.
    std::span<T> buffers() noexcept { return {velocity_.data(), velocity_.size()}; }
    std::span<const T> buffers() const noexcept { return {velocity_.data(), velocity_.size()}; }
    /// Steps taken so far (for checkpoints; SGD's arithmetic does not depend on it).
    std::size_t steps() const noexcept { return steps_; }
    /// Restores the step count when loading a checkpoint.
    void set_steps(std::size_t s) noexcept { steps_ = s; }

   private:
    void step_run(T* params, const T* grads, std::size_t offset, std::size_t n, float lr, bool decay) {
      const T lr_t = static_cast<T>(lr), mom = static_cast<T>(opts_.momentum), wd = static_cast<T>(opts_.weight_decay);
      T* const v = velocity_.size() ? velocity_.data() + offset : nullptr;
      auto run = [&]<bool WD, bool M, bool N>() {
        Backend::for_each(n, detail::sgd_update<T, WD, M, N>{params, grads, v, lr_t, mom, wd});
      };
      const bool momentum = velocity_.size() != 0;
      if (momentum && opts_.nesterov)
        decay ? run.template operator()<true, true, true>() : run.template operator()<false, true, true>();
      else if (momentum)
        decay ? run.template operator()<true, true, false>() : run.template operator()<false, true, false>();
      else
        decay ? run.template operator()<true, false, false>() : run.template operator()<false, false, false>();
    }

    options opts_;
    std::size_t size_;
    detail::decay_exemption exempt_;
    buffer<T, typename Backend::memory_space> velocity_;  // (n) or empty
    std::size_t steps_ = 0;
  };
};

}  // namespace loom
