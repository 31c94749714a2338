// SPDX-License-Identifier: Apache-2.0
#pragma once
// The losses: softmax_cross_entropy (fused and stable) and mse. Each computes the summed loss,
// the number of correct predictions and, on request, the gradient of the logits in one pass.

#include <cstddef>
#include <cstdint>

#include "loom/backend/kernels/loss.hpp"
#include "loom/core/memory.hpp"

namespace loom {

/// Sum of per-sample losses and count of correct predictions over a batch.
struct loss_value {
  double sum = 0;
  std::size_t correct = 0;
};

/// Per-sample scratch the losses write before summing, and the loss's run-time setting.
template <class Backend>
struct loss_workspace {
  buffer<double, typename Backend::memory_space> per_sample;
  buffer<std::uint8_t, typename Backend::memory_space> correct;
  /// softmax_cross_entropy's label smoothing eps in [0, 1) (trainer_options::label_smoothing;
  /// the engines set it): 0 is the plain loss, bit for bit.
  float label_smoothing = 0.0f;
  void reserve(std::size_t batch) {
    per_sample.reserve_discard(batch);
    correct.reserve_discard(batch);
  }
};

/// Softmax followed by cross-entropy against integer class labels, fused: the gradient of the
/// mean loss is (softmax - one_hot) / batch. Numerically stable for any logits. With label
/// smoothing eps (ws.label_smoothing, torch.nn.CrossEntropyLoss(label_smoothing=eps)) the
/// target is t = (1 - eps) one_hot + eps / Classes: loss = -sum_j t_j log softmax(z)_j, gradient
/// (softmax - t) / batch. The count of correct predictions is the argmax's either way.
struct softmax_cross_entropy {
  static constexpr const char* name = "softmax_cross_entropy";
  /// Whether the loss takes trainer_options::label_smoothing.
  static constexpr bool takes_label_smoothing = true;
  /// loss of each sample = log-sum-exp(z) - z[label] (eps = 0). grad (nullable) is scaled by
  /// grad_scale.
  template <class Backend, std::size_t Classes, class T>
  static loss_value compute(const T* logits, const std::int32_t* labels, T* grad, std::size_t batch, T grad_scale,
                            loss_workspace<Backend>& ws) {
    ws.reserve(batch);
    Backend::for_each(batch, kernels::softmax_cross_entropy_row<T, Classes>{logits, labels, grad, ws.per_sample.data(),
                                                                             ws.correct.data(), grad_scale,
                                                                             static_cast<T>(ws.label_smoothing)});
    return finish<Backend>(batch, ws);
  }

  template <class Backend>
  static loss_value finish(std::size_t batch, loss_workspace<Backend>& ws) {
    const double* l = ws.per_sample.data();
    const std::uint8_t* c = ws.correct.data();
    return {Backend::sum(batch, kernels::as_double<double>{l}),
            static_cast<std::size_t>(Backend::sum(batch, kernels::as_double<std::uint8_t>{c}))};
  }
};

/// Mean squared error: the mean over every element of (y - t)^2, t the one-hot of the label
/// (or an explicit target). Its per-sample loss is the row's sum of squares, so the mean loss
/// is sum / (batch * width) and the gradient 2 (y - t) / (batch * width).
struct mse {
  static constexpr const char* name = "mse";
  template <class Backend, std::size_t Width, class T>
  static loss_value compute(const T* y, const std::int32_t* labels, T* grad, std::size_t batch, T grad_scale,
                            loss_workspace<Backend>& ws) {
    return compute_target<Backend, Width, T>(y, nullptr, labels, grad, batch, grad_scale, ws);
  }
  /// With explicit targets (batch, Width); labels may be null (no accuracy then).
  template <class Backend, std::size_t Width, class T>
  static loss_value compute_target(const T* y, const T* target, const std::int32_t* labels, T* grad, std::size_t batch,
                                   T grad_scale, loss_workspace<Backend>& ws) {
    ws.reserve(batch);
    Backend::for_each(batch, kernels::squared_error_row<T, Width>{y, target, labels, grad, ws.per_sample.data(),
                                                                   ws.correct.data(), grad_scale / T(Width)});
    auto v = softmax_cross_entropy::finish<Backend>(batch, ws);
    v.sum /= static_cast<double>(Width);
    return v;
  }
};

}  // namespace loom
