// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch normalisation on the CPU. float runs oneDNN's batch normalization primitives (created
// once per batch size and input layout, then reused) on the layout the activation arrives in
// (plain, or a convolution's nChw16c / nChw8c), the ReLU after it fused into them when the
// network has one there (oneDNN's fuse_norm_relu: its mask kept for backward); the running
// statistics move by loom's own kernel body. double (gradient checks), and statistics summed
// over replicas (synchronized batch norm), run loom's kernel bodies (backend/batch_norm_kernels.hpp).
// The statistics, parameters and arithmetic are float whatever the math mode (bf16 is for
// products; a batch norm has none).

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/batch_norm_kernels.hpp"
#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/backend/cpu/launch.hpp"
#include "loom/backend/kernels/normalization.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/process_group.hpp"

namespace loom {

namespace detail {

/// float batch normalisation through oneDNN (impl/batch_norm.ipp, compiled once with
/// loom::compiled). The caller holds the statistics and the fused ReLU's workspace
/// (workspace_bytes), in loom buffers that the memory plan counts.
class dnnl_batch_norm {
 public:
  LOOM_DECL explicit dnnl_batch_norm(batch_norm_geometry g);
  LOOM_DECL dnnl_batch_norm(dnnl_batch_norm&&) noexcept;
  LOOM_DECL dnnl_batch_norm& operator=(dnnl_batch_norm&&) noexcept;
  LOOM_DECL ~dnnl_batch_norm();

  LOOM_DECL void fuse_relu();
  /// Bytes of the workspace forward_training writes for backward: the fused ReLU's mask, one
  /// byte per element (0 without a fused ReLU). Checked against oneDNN's own figure.
  std::size_t workspace_bytes(std::size_t batch) const { return relu_ ? batch * g_.c * g_.spatial() : 0; }
  /// Training: y (x's layout) from x with the batch's statistics, written to mean and var (the
  /// biased variance), C values each.
  LOOM_DECL void forward_training(const float* x, const cpu_format& xf, const float* w, const float* b, float* y,
                                  float* mean, float* var, void* workspace, std::size_t batch);
  /// Evaluation: y from x with the given statistics (the running ones).
  LOOM_DECL void forward_inference(const float* x, const cpu_format& xf, const float* w, const float* b,
                                   const float* mean, const float* var, float* y, std::size_t batch);
  /// dx (x's layout; never null), dw and db (overwritten) from dy (x's layout), with the
  /// statistics and workspace of forward_training.
  LOOM_DECL void backward(const float* x, const cpu_format& xf, const float* w, const float* b, const float* mean,
                          const float* var, const void* workspace, const float* dy, float* dx, float* dw, float* db,
                          std::size_t batch);

 private:
  struct entry;  // the primitives of one (batch, layout)
  entry& get(std::size_t batch, const cpu_format& xf);

  batch_norm_geometry g_;
  bool relu_ = false;
  std::vector<std::unique_ptr<entry>> entries_;
};

/// The CPU launcher as batch_norm_kernels sees a backend (loom::cpu itself includes this file).
struct cpu_launcher {
  using memory_space = host_space;
  template <class F>
  static void for_each(std::size_t n, F f) {
    cpu_for_each(n, f);
  }
};

/// The channel block of a CPU activation of g's shape: 1 plain, 8 or 16 blocked.
/// Throws loom::backend_error for another layout.
inline std::size_t cpu_channel_block(const cpu_format& f, std::size_t batch, std::size_t c, std::size_t h, std::size_t w) {
  if (f.plain()) return 1;
  if (const std::size_t b = channel_block(f, batch, c, h, w)) return b;
  throw backend_error("loom: an activation came in a oneDNN layout loom's kernels do not read (only plain NCHW, "
                      "nChw8c and nChw16c); channels " + std::to_string(c));
}

}  // namespace detail

/// A batch normalisation of fixed geometry, ready to run on batches: one per batch_norm layer.
template <class T>
class cpu_batch_norm_plan {
  static constexpr bool vendor = std::is_same_v<T, float>;

 public:
  explicit cpu_batch_norm_plan(batch_norm_geometry g) : g_(g), dnnl_(g), kernels_(g) {}

  /// Makes forward write relu(batch_norm(x)): the ReLU of the next layer, fused. Call before
  /// the first forward.
  void fuse_relu() {
    dnnl_.fuse_relu();
    kernels_.fuse_relu();
  }

  /// Training: y = batch_norm(x) with the batch's statistics (summed over `replicas` when given),
  /// in x's layout (returned); the running statistics move toward the batch's by momentum.
  cpu_format forward_training(const T* x, const cpu_format& xf, const T* w, const T* b, T* y, T* running_mean,
                              T* running_var, double momentum, std::size_t batch, process_group* replicas) {
    by_kernels_ = !vendor || replicas;
    inference_ = false;
    if (by_kernels_) {
      kernels_.forward_training(x, block(xf, batch), w, b, y, running_mean, running_var, momentum, batch, replicas);
    } else if constexpr (vendor) {
      mean_.reserve_discard(g_.c);
      var_.reserve_discard(g_.c);
      // The mask's bytes in floats, rounded up per sample (as the memory plan counts them).
      workspace_.reserve_discard(batch * ((dnnl_.workspace_bytes(1) + sizeof(float) - 1) / sizeof(float)));
      dnnl_.forward_training(x, xf, w, b, y, mean_.data(), var_.data(), workspace_.data(), batch);
      detail::cpu_for_each(g_.c, kernels::batch_norm_running_update<T>{mean_.data(), var_.data(), running_mean, running_var,
                                                                       momentum, static_cast<double>(batch * g_.spatial())});
    }
    return xf;
  }

  /// Evaluation: y = batch_norm(x) with the running statistics, in x's layout (returned).
  cpu_format forward_inference(const T* x, const cpu_format& xf, const T* w, const T* b, const T* running_mean,
                               const T* running_var, T* y, std::size_t batch) {
    if constexpr (vendor) {
      dnnl_.forward_inference(x, xf, w, b, running_mean, running_var, y, batch);
      running_mean_ = running_mean;  // a backward after evaluation (rare) runs the kernel bodies on them
      running_var_ = running_var;
      by_kernels_ = false;
      inference_ = true;
    } else {
      kernels_.forward_inference(x, block(xf, batch), w, b, running_mean, running_var, y, batch);
    }
    return xf;
  }

  /// After forward_training: the weight and bias gradients (overwritten, or added to when
  /// accumulate) and, when dx is not null, the input gradient, all from dy (x's layout).
  void backward(const T* x, const cpu_format& xf, const T* w, const T* b, const T* dy, T* dx, T* dw, T* db,
                std::size_t batch, bool accumulate, process_group* replicas) {
    if (by_kernels_) return kernels_.backward(x, block(xf, batch), w, dy, dx, dw, db, batch, accumulate, replicas);
    if (inference_) {  // the gradient of evaluation's normalisation, the running statistics constants
      dx_scratch_.reserve_discard(batch * g_.c * g_.spatial());
      kernels_.forward_inference(x, block(xf, batch), w, b, running_mean_, running_var_, dx_scratch_.data(), batch);
      return kernels_.backward(x, block(xf, batch), w, dy, dx, dw, db, batch, accumulate, nullptr);
    }
    if constexpr (vendor) {
      // oneDNN writes every gradient: the input's into dx (or a scratch when it is not asked
      // for), the parameters' into dw and db (or a scratch added to them when accumulating).
      T* dsrc = dx;
      if (!dsrc) {
        dx_scratch_.reserve_discard(batch * g_.c * g_.spatial());
        dsrc = dx_scratch_.data();
      }
      T* dscale = dw;
      T* dshift = db;
      if (accumulate) {
        dparams_.reserve_discard(2 * g_.c);
        dscale = dparams_.data();
        dshift = dparams_.data() + g_.c;
      }
      dnnl_.backward(x, xf, w, b, mean_.data(), var_.data(), workspace_.data(), dy, dsrc, dscale, dshift, batch);
      if (accumulate)
        for (std::size_t c = 0; c < g_.c; ++c) dw[c] += dscale[c], db[c] += dshift[c];
    }
  }

 private:
  std::size_t block(const cpu_format& f, std::size_t batch) const {
    return detail::cpu_channel_block(f, batch, g_.c, g_.h, g_.w);
  }

  struct no_vendor {  // double: oneDNN has no f64 batch norm
    explicit no_vendor(batch_norm_geometry) {}
    void fuse_relu() {}
  };

  batch_norm_geometry g_;
  std::conditional_t<vendor, detail::dnnl_batch_norm, no_vendor> dnnl_;
  detail::batch_norm_kernels<T, detail::cpu_launcher> kernels_;
  bool by_kernels_ = !vendor, inference_ = false;
  const T* running_mean_ = nullptr;  // those of the last evaluation forward (oneDNN's)
  const T* running_var_ = nullptr;
  buffer<T> mean_, var_;      // (C) each: the last training forward's statistics (oneDNN's)
  buffer<float> workspace_;   // the fused ReLU's mask (bytes, in floats)
  buffer<T> dx_scratch_;      // (batch, In): the input gradient nobody asked for (a first layer)
  buffer<T> dparams_;         // (2C): the parameter gradients before they are added
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/batch_norm.ipp"
#endif
