// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel bodies of the losses, one sample per call: loss value, gradient and whether the
// prediction was right, fused in one pass over the row.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"

namespace loom::kernels {

/// Softmax cross-entropy of one row of logits, stable (max subtracted before exp).
/// loss[n] = logsumexp(z) - z[label]; grad[n, j] = (softmax(z)_j - [j == label]) * scale.
/// With label smoothing eps > 0 (torch.nn.CrossEntropyLoss(label_smoothing=eps)) the target is
/// t = (1 - eps) one_hot + eps / Classes: loss[n] = (1 - eps) (lse - z[label]) + eps / Classes
/// sum_j (lse - z[j]); grad[n, j] = (softmax(z)_j - t_j) * scale. eps = 0 takes none of that
/// arithmetic. correct[n] is the argmax's either way.
template <class T, std::size_t Classes>
struct softmax_cross_entropy_row {
  const T* logits;            // (batch, Classes)
  const std::int32_t* labels; // (batch)
  T* grad;                    // (batch, Classes) or null
  double* loss;               // (batch)
  std::uint8_t* correct;      // (batch)
  T scale;
  T eps = 0;                  // label smoothing, in [0, 1)
  LOOM_HD void operator()(std::size_t n) const {
    const T* z = logits + n * Classes;
    T m = z[0];
    std::size_t arg = 0;
    for (std::size_t j = 1; j < Classes; ++j)
      if (z[j] > m) m = z[j], arg = j;
    T s = 0;
    for (std::size_t j = 0; j < Classes; ++j) s += std::exp(z[j] - m);
    const auto label = static_cast<std::size_t>(labels[n]);
    T on = T(1), off = T(0);  // the target's values
    if (eps == T(0)) {
      // (m - z[label]) first: forming m + log(s) would round log(s) to the ulp of m (6e-5 at
      // |m| = 1000 in float) before z[label] cancels m.
      loss[n] = static_cast<double>((m - z[label]) + std::log(s));
    } else {
      T gap = 0;  // sum_j (m - z[j]), each term >= 0
      for (std::size_t j = 0; j < Classes; ++j) gap += m - z[j];
      const T log_s = std::log(s);
      const T nll = (m - z[label]) + log_s;                    // -log p[label]
      const T smooth = gap + static_cast<T>(Classes) * log_s;  // -sum_j log p[j]
      off = eps / static_cast<T>(Classes);
      on = T(1) - eps + off;
      loss[n] = static_cast<double>((T(1) - eps) * nll + off * smooth);
    }
    correct[n] = arg == label;
    if (grad) {
      T* g = grad + n * Classes;
      const T inv = T(1) / s;
      for (std::size_t j = 0; j < Classes; ++j) g[j] = (std::exp(z[j] - m) * inv - (j == label ? on : off)) * scale;
    }
  }
};

/// Squared error of one row against a target row (or the one-hot of a label when target is
/// null). loss[n] = sum_j (y - t)^2; grad = 2 (y - t) * scale.
template <class T, std::size_t Width>
struct squared_error_row {
  const T* y;
  const T* target;            // (batch, Width) or null
  const std::int32_t* labels; // used when target is null
  T* grad;
  double* loss;
  std::uint8_t* correct;
  T scale;
  LOOM_HD void operator()(std::size_t n) const {
    const T* r = y + n * Width;
    double s = 0;
    std::size_t arg = 0;
    for (std::size_t j = 0; j < Width; ++j) {
      const T t = target ? target[n * Width + j] : (static_cast<std::size_t>(labels[n]) == j ? T(1) : T(0));
      const T d = r[j] - t;
      s += static_cast<double>(d) * static_cast<double>(d);
      if (grad) grad[n * Width + j] = T(2) * d * scale;
      if (r[j] > r[arg]) arg = j;
    }
    loss[n] = s;
    correct[n] = labels ? (arg == static_cast<std::size_t>(labels[n])) : 0;
  }
};

/// v[i] as a double: the term Backend::sum adds up for a total of per-sample values.
template <class U>
struct as_double {
  const U* v;
  LOOM_HD double operator()(std::size_t i) const { return static_cast<double>(v[i]); }
};

}  // namespace loom::kernels
