// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch normalisation on the GPU through cuDNN (spatial mode: per channel over the batch and
// the image; a vector of features is an image of 1 x 1), on plain NCHW data: cuDNN's training
// forward moves the running statistics itself (momentum as its exponential average factor, the
// unbiased variance, as PyTorch's), its backward adds to the parameter gradients when asked
// (beta = 1). A fused ReLU is one element-wise pass after the forward. Statistics summed over
// replicas (synchronized batch norm) run loom's kernel bodies (backend/batch_norm_kernels.hpp)
// instead. Needs nvcc.

#include <cudnn.h>

#include <cstddef>

#include "loom/backend/batch_norm_kernels.hpp"
#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/conv2d.hpp"
#include "loom/backend/cuda/launch.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/backend/kernels/activation.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/process_group.hpp"

namespace loom {

namespace detail {
/// The CUDA launcher as batch_norm_kernels sees a backend (loom::cuda itself includes this file).
struct cuda_launcher {
  using memory_space = cuda_space;
  template <class F>
  static void for_each(std::size_t n, F f) {
    cuda_for_each(n, f);
  }
};
}  // namespace detail

template <class T>
class cuda_batch_norm_plan {
 public:
  explicit cuda_batch_norm_plan(batch_norm_geometry g) : g_(g), kernels_(g) {}

  /// Makes forward write relu(batch_norm(x)): the next layer's ReLU, one pass after cuDNN's.
  void fuse_relu() {
    relu_ = true;
    kernels_.fuse_relu();
  }

  /// Training: y = batch_norm(x) with the batch's statistics (summed over `replicas` when given);
  /// the running statistics move toward the batch's by momentum.
  cuda_format forward_training(const T* x, const cuda_format&, const T* w, const T* b, T* y, T* running_mean,
                               T* running_var, double momentum, std::size_t batch, process_group* replicas) {
    by_kernels_ = replicas != nullptr;
    inference_ = false;
    if (by_kernels_) {
      kernels_.forward_training(x, 1, w, b, y, running_mean, running_var, momentum, batch, replicas);
      return {};
    }
    const descriptors& d = get(batch);
    saved_mean_.reserve_discard(g_.c);
    saved_invstd_.reserve_discard(g_.c);
    const T one = 1, zero = 0;
    LOOM_CUDA_CHECK(cudnnBatchNormalizationForwardTraining(
        detail::cudnn_handle(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, d.data.get(), x, d.data.get(), y, d.channels.get(),
        w, b, momentum, running_mean, running_var, g_.eps, saved_mean_.data(), saved_invstd_.data()));
    relu_pass(y, batch);
    return {};
  }

  /// Evaluation: y = batch_norm(x) with the running statistics.
  cuda_format forward_inference(const T* x, const cuda_format&, const T* w, const T* b, const T* running_mean,
                                const T* running_var, T* y, std::size_t batch) {
    by_kernels_ = false;
    inference_ = true;
    running_mean_ = running_mean;  // a backward after evaluation (rare) runs the kernel bodies on them
    running_var_ = running_var;
    const descriptors& d = get(batch);
    const T one = 1, zero = 0;
    LOOM_CUDA_CHECK(cudnnBatchNormalizationForwardInference(detail::cudnn_handle(), CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                            d.data.get(), x, d.data.get(), y, d.channels.get(), w, b,
                                                            running_mean, running_var, g_.eps));
    relu_pass(y, batch);
    return {};
  }

  /// After forward_training: dw, db (overwritten, or added to when accumulate) and dx (when not
  /// null) from dy; w and b the weight and bias.
  void backward(const T* x, const cuda_format&, const T* w, const T* b, const T* dy, T* dx, T* dw, T* db,
                std::size_t batch, bool accumulate, process_group* replicas) {
    if (by_kernels_) return kernels_.backward(x, 1, w, dy, dx, dw, db, batch, accumulate, replicas);
    if (inference_) {  // the gradient of evaluation's normalisation, the running statistics constants
      dx_scratch_.reserve_discard(batch * g_.c * g_.spatial());
      kernels_.forward_inference(x, 1, w, b, running_mean_, running_var_, dx_scratch_.data(), batch);
      return kernels_.backward(x, 1, w, dy, dx, dw, db, batch, accumulate, nullptr);
    }
    const descriptors& d = get(batch);
    if (!dx) {
      dx_scratch_.reserve_discard(batch * g_.c * g_.spatial());
      dx = dx_scratch_.data();
    }
    const T one = 1, zero = 0, keep = accumulate ? T(1) : T(0);
    LOOM_CUDA_CHECK(cudnnBatchNormalizationBackward(detail::cudnn_handle(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one,
                                                    &keep, d.data.get(), x, d.data.get(), dy, d.data.get(), dx,
                                                    d.channels.get(), w, dw, db, g_.eps, saved_mean_.data(),
                                                    saved_invstd_.data()));
  }

 private:
  struct descriptors {
    std::size_t batch = 0;
    detail::cudnn_tensor data, channels;
  };
  const descriptors& get(std::size_t batch) {
    if (d_.batch != batch || !d_.data.get()) {
      d_.data = detail::make_nchw<T>(batch, g_.c, g_.h, g_.w);
      cudnnTensorDescriptor_t c = nullptr;
      LOOM_CUDA_CHECK(cudnnCreateTensorDescriptor(&c));
      d_.channels = detail::cudnn_tensor(c);
      LOOM_CUDA_CHECK(cudnnDeriveBNTensorDescriptor(c, d_.data.get(), CUDNN_BATCHNORM_SPATIAL));
      d_.batch = batch;
    }
    return d_;
  }
  void relu_pass(T* y, std::size_t batch) {
    if (relu_) detail::cuda_for_each(batch * g_.c * g_.spatial(), kernels::pointwise_forward<kernels::relu_op, T>{y, y});
  }

  batch_norm_geometry g_;
  bool relu_ = false, by_kernels_ = false, inference_ = false;
  const T* running_mean_ = nullptr;  // those of the last evaluation forward
  const T* running_var_ = nullptr;
  descriptors d_;
  detail::batch_norm_kernels<T, detail::cuda_launcher> kernels_;
  buffer<T, cuda_space> saved_mean_, saved_invstd_;  // (C): cuDNN's statistics for backward
  buffer<T, cuda_space> dx_scratch_;                 // the input gradient nobody asked for
};

}  // namespace loom
