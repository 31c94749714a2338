// SPDX-License-Identifier: Apache-2.0
#pragma once
// The element-wise bodies of every optimizer update and of gradient clipping, written once as
// LOOM_HD functors so the CPU launcher and (later) the CUDA launcher run the same arithmetic.
// Each update is fused: one pass reads param, grad and state and writes param and state. The
// host-side bookkeeping (validation, step counters, bias corrections) lives in loom/optim/.

#include <cmath>
#include <cstddef>

#include "loom/core/config.hpp"

namespace loom::detail {

/// One SGD step on element i, as torch.optim.SGD with dampening 0:
///   d = g + weight_decay * p                       (when weight_decay != 0)
///   buf = momentum * buf + d                        (when momentum != 0)
///   d = nesterov ? d + momentum * buf : buf         (when momentum != 0)
///   p = p - lr * d
/// PyTorch sets buf = d on the first step; with buf zero-initialised, momentum * 0 + d is that
/// same value exactly, so no first-step flag is needed.
/// Requires: velocity is null exactly when momentum == 0.
/// SGD's step. The choices (weight decay, momentum, Nesterov) are template arguments so that
/// each variant is a branch-free loop the compiler vectorises.
template <class T, bool WeightDecay, bool Momentum, bool Nesterov>
struct sgd_update {
  T* param;
  const T* grad;
  T* velocity;  // the momentum buffer; unused without momentum
  T lr;
  T momentum;
  T weight_decay;

  LOOM_HD void operator()(std::size_t i) const {
    T d = grad[i];
    if constexpr (WeightDecay) d = d + weight_decay * param[i];
    if constexpr (Momentum) {
      const T buf = momentum * velocity[i] + d;
      velocity[i] = buf;
      if constexpr (Nesterov)
        d = d + momentum * buf;
      else
        d = buf;
    }
    param[i] = param[i] - lr * d;
  }
};

template <class T>
struct adam_update {
  T* param;
  const T* grad;
  T* exp_avg;     // m, first moment
  T* exp_avg_sq;  // v, second moment
  T beta1;
  T beta2;
  T one_minus_beta1;
  T one_minus_beta2;
  T eps;
  T l2;            // weight decay added to the gradient (Adam)
  T decay_factor;  // decoupled weight decay as a factor on the parameter (AdamW)
  T step_size;
  T bias_correction2_sqrt;

  LOOM_HD void operator()(std::size_t i) const {
    T p = param[i];
    T g = grad[i];
    if (decay_factor != T(1)) p = p * decay_factor;
    if (l2 != T(0)) g = g + l2 * p;
    const T m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const T v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const T denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = p + (-step_size * m) / denom;
  }
};

/// x[i]^2 in double: the term Backend::sum adds up for a global L2 norm.
template <class T>
struct squared_term {
  const T* x;

  LOOM_HD double operator()(std::size_t i) const {
    const double v = static_cast<double>(x[i]);
    return v * v;
  }
};

/// x[i] *= factor: the scaling step of gradient clipping.
template <class T>
struct scale_by {
  T* x;
  T factor;

  LOOM_HD void operator()(std::size_t i) const { x[i] = x[i] * factor; }
};

}  // namespace loom::detail
