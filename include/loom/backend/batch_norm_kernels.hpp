// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch normalisation by loom's own kernel bodies (backend/kernels/normalization.hpp) on any
// backend, through its for_each: the path of scalar types the vendor has no batch norm for
// (double, for gradient checks), and of statistics summed over replicas (synchronized batch
// norm): forward sums each channel's values and squares and backward its two gradient sums,
// both in double, and a process_group adds them up between the sums and their use. The
// backends' batch_norm_plan runs it where their vendor's call does not serve.

#include <cstddef>
#include <string>

#include "loom/backend/kernels/normalization.hpp"
#include "loom/core/error.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/process_group.hpp"

namespace loom::detail {

/// A synchronized batch norm's count of values per channel over every replica, after the sums
/// went over the group: one value has no variance. Each rank sees the same count, so every rank
/// throws alike and none waits for the others.
inline void check_synchronized_count(std::size_t channels, double count, int ranks) {
  if (count <= 1)
    throw invalid_argument("loom::batch_norm (" + std::to_string(channels) +
                           " channels, synchronized): expected more than 1 value per channel when training, got " +
                           std::to_string(static_cast<long long>(count)) + " over the " + std::to_string(ranks) +
                           " replicas' batches together: train with a larger batch, or evaluate");
}

/// One batch norm of geometry g on Backend by the kernel bodies. Its statistics (mean and
/// 1 / std per channel) and sums live in Backend's memory; `block` is the channel block of the
/// activation's layout (1 plain, 8 or 16 blocked), as Backend reports it.
template <class T, class Backend>
class batch_norm_kernels {
  using space = typename Backend::memory_space;

 public:
  explicit batch_norm_kernels(batch_norm_geometry g) : g_(g) {}
  void fuse_relu() { relu_ = true; }

  /// Training: y = normalised x with the batch's statistics — summed over `replicas` when given
  /// (every rank of the group calls alike) — and the running statistics moved toward them.
  void forward_training(const T* x, std::size_t block, const T* w, const T* b, T* y, T* running_mean, T* running_var,
                        double momentum, std::size_t batch, process_group* replicas) {
    const std::size_t c = g_.c;
    const kernels::channel_layout l = layout(batch, block);
    training_ = true;
    sums_.reserve_discard(2 * c + 1);
    mean_.reserve_discard(c);
    invstd_.reserve_discard(c);
    Backend::for_each(c + 1, kernels::batch_norm_sums<T>{x, l, sums_.data()});
    if (replicas) {
      replicas->allreduce_sum(sums_.data(), 2 * c + 1);
      check_group_count(replicas->size());
    }
    Backend::for_each(c, kernels::batch_norm_moments<T>{sums_.data(), c, g_.eps, momentum, mean_.data(), invstd_.data(),
                                                        running_mean, running_var});
    Backend::for_each(l.size(), kernels::batch_norm_normalize<T>{x, mean_.data(), invstd_.data(), w, b, y, l, relu_});
  }

  /// Evaluation: y = x normalised with the running statistics.
  void forward_inference(const T* x, std::size_t block, const T* w, const T* b, const T* running_mean,
                         const T* running_var, T* y, std::size_t batch) {
    const kernels::channel_layout l = layout(batch, block);
    training_ = false;
    mean_.reserve_discard(g_.c);
    invstd_.reserve_discard(g_.c);
    Backend::for_each(g_.c, kernels::batch_norm_running_moments<T>{running_mean, running_var, g_.eps, mean_.data(),
                                                                   invstd_.data()});
    Backend::for_each(l.size(), kernels::batch_norm_normalize<T>{x, mean_.data(), invstd_.data(), w, b, y, l, relu_});
  }

  /// Backward from dy (x's layout) after forward_training, or after forward_inference (the
  /// running statistics then constants): the weight and bias gradients (overwritten, or added
  /// to when accumulate: this rank's own, as every parameter's) and, when dx is not null, the
  /// input gradient — after training from the gradient sums summed over `replicas` when given.
  void backward(const T* x, std::size_t block, const T* w, const T* dy, T* dx, T* dw, T* db, std::size_t batch,
                bool accumulate, process_group* replicas) {
    const std::size_t c = g_.c;
    const kernels::channel_layout l = layout(batch, block);
    grad_sums_.reserve_discard(2 * c);
    Backend::for_each(c, kernels::batch_norm_gradient_sums<T>{x, dy, mean_.data(), invstd_.data(), l, grad_sums_.data()});
    // The weight and bias gradients are this rank's sums, as every other parameter's (the
    // engine sums them over the replicas with the rest); the input gradient needs the group's.
    Backend::for_each(c, kernels::batch_norm_parameter_gradients<T>{grad_sums_.data(), c, dw, db, accumulate});
    if (replicas && training_) replicas->allreduce_sum(grad_sums_.data(), 2 * c);
    if (dx)
      Backend::for_each(l.size(), kernels::batch_norm_input_gradient<T>{x, dy, mean_.data(), invstd_.data(), w,
                                                                        grad_sums_.data(),
                                                                        training_ ? sums_.data() + 2 * c : nullptr, l, dx});
  }

 private:
  kernels::channel_layout layout(std::size_t batch, std::size_t block) const {
    return {batch, g_.c, g_.spatial(), block};
  }
  /// After the sums went over the group: their count, checked (check_synchronized_count).
  void check_group_count(int ranks) const {
    double count = 0;
    if constexpr (space::host_accessible) count = sums_.data()[2 * g_.c];
    else space::copy_to_host(&count, sums_.data() + 2 * g_.c, sizeof(double));
    check_synchronized_count(g_.c, count, ranks);
  }

  batch_norm_geometry g_;
  bool relu_ = false, training_ = true;  // training_: the last forward normalised with the batch's statistics
  buffer<double, space> sums_, grad_sums_;  // (2C + 1): sums, squares, count; (2C): dy, dy * xhat
  buffer<T, space> mean_, invstd_;         // (C) each, the last training forward's (or evaluation's)
};

}  // namespace loom::detail
