// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch normalisation on the CPU. float runs oneDNN's batch normalization primitives (created
// once per batch size and input layout, then reused) on the layout the activation arrives in
// (plain, or a convolution's nChw16c / nChw8c), the ReLU after it fused into them when the
// network has one there (oneDNN's fuse_norm_relu: its mask kept for backward); the running
// statistics move by loom's own kernel body. An image on channels-last (a bf16 convolution's
// output) of other than 8 or 16 channels runs loom's own passes (batch_norm_rows.hpp: oneDNN
// 2.6's nhwc kernels are the slow ones), and so does a synchronized batch norm on any layout but
// plain: the sums of its forward and of its backward go over the group between two passes, one
// forward and one backward (oneDNN takes the statistics as its own or as given, so it ran
// forward twice and corrected the input gradient in a third pass; it still does on plain
// layouts and vectors: each rank's statistics from its primitive, added up as sums in double, a
// second forward with the group's given, backward with them and the input gradient corrected to
// the group's sums in one pass of a + b x). double (gradient checks), and a rank without samples
// in a synchronized batch norm, run loom's kernel bodies (backend/batch_norm_kernels.hpp), which
// exchange the same sums.
// The statistics, parameters and arithmetic are float whatever the math mode (bf16 is for
// products; a batch norm has none).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/batch_norm_kernels.hpp"
#include "loom/backend/cpu/batch_norm_rows.hpp"
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
  /// Training with statistics given in mean and var (a synchronized batch norm's, taken over
  /// every replica): y and the fused ReLU's workspace as forward_training writes them, for the
  /// same backward.
  LOOM_DECL void forward_training_given(const float* x, const cpu_format& xf, const float* w, const float* b, float* y,
                                        const float* mean, const float* var, void* workspace, std::size_t batch);
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

/// The channel block of a CPU activation of g's shape: 1 plain, 8 or 16 blocked, c
/// channels-last. Throws loom::backend_error for another layout.
inline std::size_t cpu_channel_block(const cpu_format& f, std::size_t batch, std::size_t c, std::size_t h, std::size_t w) {
  if (f.plain()) return 1;
  if (const std::size_t b = channel_block(f, batch, c, h, w)) return b;
  throw backend_error("loom: an activation came in a oneDNN layout loom's kernels do not read (only plain NCHW, "
                      "nChw8c, nChw16c and nhwc); channels " + std::to_string(c));
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
    relu_ = true;
  }

  /// Whether the next backward applies the fused ReLU's gradient itself: after a training
  /// forward through oneDNN, whose backward takes the ReLU's mask (the kernel bodies take dy
  /// with it applied already).
  bool backward_applies_fused_relu() const { return relu_ && mode_ != path::kernels && !inference_; }

  /// Training: y = batch_norm(x) with the batch's statistics (summed over `replicas` when given),
  /// in x's layout (returned); the running statistics move toward the batch's by momentum. With
  /// bf16_copy, where loom's own passes run (channels-last, or synchronized: own_rows), y's bf16
  /// copy too: output_bf16() after it (null where none was written). bf16_gradient_copy: the
  /// backward after it will ask for dx's (both steer own_rows). copy_only: where the copy is
  /// written, y's float values are not (nothing reads them: the convolution after reads the
  /// copy alone, detail::dnnl_conv2d::reads_copies_only); y keeps what it held.
  cpu_format forward_training(const T* x, const cpu_format& xf, const T* w, const T* b, T* y, T* running_mean,
                              T* running_var, double momentum, std::size_t batch, process_group* replicas,
                              bool bf16_copy = false, bool bf16_gradient_copy = false, bool copy_only = false) {
    // A rank without samples (a short last batch) takes part in the sums by the kernel bodies.
    // A group of one (one rank, or one survivor of a recovery) has the statistics oneDNN gives.
    const bool group = replicas && replicas->size() > 1;
    mode_ = !vendor || (group && batch == 0) ? path::kernels
            : own_rows(xf, batch, group, bf16_copy || bf16_gradient_copy) ? path::rows
            : group                          ? path::vendor_synchronized
                                             : path::vendor;
    synchronized_ = group;
    inference_ = false;
    output_bf16_ = nullptr;
    input_gradient_bf16_ = nullptr;
    if (mode_ == path::kernels) {
      kernels_.forward_training(x, block(xf, batch), w, b, y, running_mean, running_var, momentum, batch, replicas);
    } else if (mode_ == path::rows) {
      if constexpr (vendor)
        rows_forward(x, xf, w, b, bf16_copy && copy_only ? nullptr : y, running_mean, running_var, momentum, batch,
                     replicas, bf16_copy);
    } else if constexpr (vendor) {
      mean_.reserve_discard(g_.c);
      var_.reserve_discard(g_.c);
      // The mask's bytes in floats, rounded up per sample (as the memory plan counts them).
      workspace_.reserve_discard(batch * ((dnnl_.workspace_bytes(1) + sizeof(float) - 1) / sizeof(float)));
      // This rank's statistics (oneDNN's, and its y, which the synchronized path writes again).
      dnnl_.forward_training(x, xf, w, b, y, mean_.data(), var_.data(), workspace_.data(), batch);
      if (mode_ == path::vendor) {
        detail::cpu_for_each(g_.c, kernels::batch_norm_running_update<T>{mean_.data(), var_.data(), running_mean,
                                                                         running_var, momentum,
                                                                         static_cast<double>(batch * g_.spatial())});
      } else {
        synchronize_statistics(batch, running_mean, running_var, momentum, *replicas);
        dnnl_.forward_training_given(x, xf, w, b, y, mean_.data(), var_.data(), workspace_.data(), batch);
      }
    }
    return xf;
  }

  /// The bf16 copy of the last forward's y (forward_training's bf16_copy), or null.
  const std::uint16_t* output_bf16() const { return output_bf16_; }
  /// The bf16 copy of the last backward's dx (backward's bf16_copy), or null.
  const std::uint16_t* input_gradient_bf16() const { return input_gradient_bf16_; }

  /// Evaluation: y = batch_norm(x) with the running statistics, in x's layout (returned).
  cpu_format forward_inference(const T* x, const cpu_format& xf, const T* w, const T* b, const T* running_mean,
                               const T* running_var, T* y, std::size_t batch) {
    output_bf16_ = nullptr;
    if constexpr (vendor) {
      dnnl_.forward_inference(x, xf, w, b, running_mean, running_var, y, batch);
      running_mean_ = running_mean;  // a backward after evaluation (rare) runs the kernel bodies on them
      running_var_ = running_var;
      mode_ = path::vendor;
      inference_ = true;
    } else {
      kernels_.forward_inference(x, block(xf, batch), w, b, running_mean, running_var, y, batch);
    }
    return xf;
  }

  /// After forward_training: the weight and bias gradients (overwritten, or added to when
  /// accumulate) and, when dx is not null, the input gradient, all from dy (x's layout). With a
  /// fused ReLU, backward_applies_fused_relu() tells whether dy is the ReLU output's gradient
  /// (then the ReLU's gradient is taken where forward's output was positive: from oneDNN's mask,
  /// or recomputed from x by loom's passes). y, forward's output, is not read. With bf16_copy,
  /// where loom's own passes run, dx's bf16 copy too: input_gradient_bf16() after it; with
  /// copy_only as well, that copy alone (dx keeps what it held: nothing reads it, as forward's).
  void backward(const T* x, const cpu_format& xf, const T* w, const T* b, const T* dy, T* dx, T* dw, T* db,
                std::size_t batch, bool accumulate, process_group* replicas, [[maybe_unused]] const T* y,
                bool bf16_copy = false, bool copy_only = false) {
    input_gradient_bf16_ = nullptr;
    if (mode_ == path::rows) {
      if constexpr (vendor) rows_backward(x, xf, w, dy, dx, dw, db, batch, accumulate, replicas, bf16_copy, copy_only);
      return;
    }
    if (mode_ == path::kernels)
      return kernels_.backward(x, block(xf, batch), w, dy, dx, dw, db, batch, accumulate, replicas);
    if (inference_) {  // the gradient of evaluation's normalisation, the running statistics constants
      dx_scratch_.reserve_discard(batch * g_.c * g_.spatial());
      kernels_.forward_inference(x, block(xf, batch), w, b, running_mean_, running_var_, dx_scratch_.data(), batch);
      return kernels_.backward(x, block(xf, batch), w, dy, dx, dw, db, batch, accumulate, nullptr);
    }
    if constexpr (vendor) {
      // oneDNN writes every gradient: the input's into dx (or a scratch when it is not asked
      // for), the parameters' into dw and db (or a scratch added to them when accumulating, or
      // when synchronized: the correction below needs this rank's own).
      T* dsrc = dx;
      if (!dsrc) {
        dx_scratch_.reserve_discard(batch * g_.c * g_.spatial());
        dsrc = dx_scratch_.data();
      }
      const bool own = accumulate || mode_ == path::vendor_synchronized;
      T* dscale = dw;
      T* dshift = db;
      if (own) {
        dparams_.reserve_discard(2 * g_.c);
        dscale = dparams_.data();
        dshift = dparams_.data() + g_.c;
      }
      dnnl_.backward(x, xf, w, b, mean_.data(), var_.data(), workspace_.data(), dy, dsrc, dscale, dshift, batch);
      if (own)
        for (std::size_t c = 0; c < g_.c; ++c) {
          dw[c] = accumulate ? dw[c] + dscale[c] : dscale[c];
          db[c] = accumulate ? db[c] + dshift[c] : dshift[c];
        }
      if (mode_ == path::vendor_synchronized) {
        if (!replicas)
          throw error("loom::batch_norm (" + std::to_string(g_.c) + " channels): a backward without the replicas its "
                      "synchronized forward took the statistics of");
        synchronize_input_gradient(x, xf, w, dx, batch, *replicas);
      }
    }
  }

 private:
  // kernels: loom's kernel bodies (double; or a rank without samples in a synchronized batch
  // norm); vendor: oneDNN alone; vendor_synchronized: oneDNN with the statistics and gradient
  // sums of every replica (synchronize_statistics, synchronize_input_gradient); rows: loom's
  // passes over channels-innermost layouts (batch_norm_rows.hpp), synchronized or not.
  enum class path { kernels, vendor, vendor_synchronized, rows };

  /// Whether float training takes loom's own passes: on an image whose channels are innermost
  /// (nChw16c, nChw8c, channels-last) when synchronized, and on channels-last of other than 8 or
  /// 16 channels alone (8 and 16 are blocked layouts byte for byte, where oneDNN's kernels are
  /// the faster: 0.75-0.87x for loom's at 64 x 16..512 channels, batch 64, one thread) — of 8
  /// or 16 too when bf16 copies of y or dx are asked for (bf16 math), which loom's passes write
  /// as they go and oneDNN's would need converted after them: ResNet-20 bf16 at one thread,
  /// 870 -> 885 samples/s (medians of 5), its 16-channel stage's 11 conversions a step gone.
  bool own_rows(const cpu_format& xf, std::size_t batch, bool group, bool bf16_copies) const {
    if (!vendor || g_.rank == 1 || batch == 0 || xf.plain()) return false;
    const std::size_t blk = block(xf, batch);
    if (group) return blk == 8 || blk == 16 || blk == g_.c;
    return blk == g_.c && ((g_.c != 8 && g_.c != 16) || bf16_copies);
  }

  detail::batch_norm_rows_layout rows_layout(const cpu_format& xf, std::size_t batch) const {
    return {batch, g_.c, g_.spatial(), block(xf, batch)};
  }

  /// The rows path's forward: this rank's sums, over the group when synchronized, the
  /// statistics (and the running ones) from them, then y in one pass.
  void rows_forward(const T* x, const cpu_format& xf, const T* w, const T* b, T* y, T* running_mean, T* running_var,
                    double momentum, std::size_t batch, process_group* replicas, bool bf16_copy) {
    const std::size_t c = g_.c;
    const detail::batch_norm_rows_layout l = rows_layout(xf, batch);
    sums_.reserve_discard(2 * c + 1);
    partials_.reserve_discard(detail::batch_norm_rows_partials(c));
    detail::batch_norm_rows_sums(x, l, partials_.data(), sums_.data());
    if (synchronized_) {
      replicas->allreduce_sum(sums_.data(), 2 * c + 1);
      detail::check_synchronized_count(c, sums_.data()[2 * c], replicas->size());
    }
    mean_.reserve_discard(c);
    invstd_.reserve_discard(c);
    detail::cpu_for_each(c, kernels::batch_norm_moments<T>{sums_.data(), c, g_.eps, momentum, mean_.data(),
                                                           invstd_.data(), running_mean, running_var});
    // a, b, d (backward's), then forward's scale and shift: backward recomputes a fused ReLU's
    // gradient from them (the shift copied: the bits forward used, whatever happens to b).
    coefficients_.reserve_discard(5 * c);
    T* scale = coefficients_.data() + 3 * c;
    for (std::size_t k = 0; k < c; ++k) scale[k] = w[k] * invstd_.data()[k];
    std::copy_n(b, c, scale + c);
    std::uint16_t* y16 = nullptr;
    if (bf16_copy) {
      output_copy_.reserve_discard(batch * c * g_.spatial());
      y16 = output_copy_.data();
    }
    detail::batch_norm_rows_normalize(x, l, mean_.data(), scale, scale + c, y, relu_, y16);
    output_bf16_ = y16;
  }

  /// The rows path's backward: this rank's gradient sums (its weight and bias gradients), over
  /// the group when synchronized, then dx in one pass: w invstd (g - S(g) / N - xhat S(g xhat) / N).
  /// A fused ReLU's gradient comes from x and forward's scale and shift, not from y.
  void rows_backward(const T* x, const cpu_format& xf, const T* w, const T* dy, T* dx, T* dw, T* db, std::size_t batch,
                     bool accumulate, process_group* replicas, bool bf16_copy, bool copy_only) {
    const std::size_t c = g_.c;
    if (synchronized_ && !replicas)
      throw error("loom::batch_norm (" + std::to_string(c) + " channels): a backward without the replicas its "
                  "synchronized forward took the statistics of");
    const detail::batch_norm_rows_layout l = rows_layout(xf, batch);
    grad_sums_.reserve_discard(2 * c);
    double* s = grad_sums_.data();
    const T* relu_scale = relu_ ? coefficients_.data() + 3 * c : nullptr;  // forward's (rows_forward)
    const T* relu_shift = relu_ ? coefficients_.data() + 4 * c : nullptr;
    detail::batch_norm_rows_gradient_sums(x, dy, l, mean_.data(), relu_scale, relu_shift, partials_.data(), s);
    const T* invstd = invstd_.data();
    for (std::size_t k = 0; k < c; ++k) {  // this rank's own, as every parameter's gradient
      const T gw = static_cast<T>(invstd[k] * s[c + k]), gb = static_cast<T>(s[k]);
      dw[k] = accumulate ? dw[k] + gw : gw;
      db[k] = accumulate ? db[k] + gb : gb;
    }
    if (synchronized_) replicas->allreduce_sum(s, 2 * c);
    if (!dx) return;
    const double n = sums_.data()[2 * c];
    T* a = coefficients_.data();
    T* bx = a + c;
    T* d = a + 2 * c;
    for (std::size_t k = 0; k < c; ++k) {
      const double is = invstd[k], scale = static_cast<double>(w[k]) * is;
      a[k] = static_cast<T>(scale);
      bx[k] = static_cast<T>(-scale * is * is * s[c + k] / n);
      d[k] = static_cast<T>(-scale * s[k] / n);
    }
    std::uint16_t* dx16 = nullptr;
    if (bf16_copy) {
      gradient_copy_.reserve_discard(batch * c * g_.spatial());
      dx16 = gradient_copy_.data();
    }
    detail::batch_norm_rows_input_gradient(x, dy, l, mean_.data(), relu_scale, relu_shift, a, bx, d,
                                           dx16 && copy_only ? nullptr : dx, dx16);
    input_gradient_bf16_ = dx16;
  }

  std::size_t block(const cpu_format& f, std::size_t batch) const {
    return detail::cpu_channel_block(f, batch, g_.c, g_.h, g_.w);
  }

  /// This rank's statistics (mean_, var_: oneDNN's over its batch of n values per channel) as
  /// sums in double — n mean, n (var + mean^2), n: what the kernel bodies sum, so that a rank
  /// without samples adds its zeros alike — added up over the replicas; then the group's mean
  /// and biased variance written back to mean_ and var_, and the running statistics moved by
  /// the kernel body the other path uses (every rank alike, bitwise).
  void synchronize_statistics(std::size_t batch, T* running_mean, T* running_var, double momentum,
                              process_group& replicas) {
    const std::size_t c = g_.c;
    const double n = static_cast<double>(batch * g_.spatial());
    sums_.reserve_discard(2 * c + 1);
    double* s = sums_.data();
    for (std::size_t k = 0; k < c; ++k) {
      const double m = mean_.data()[k], v = var_.data()[k];
      s[k] = n * m;
      s[c + k] = n * (v + m * m);
    }
    s[2 * c] = n;
    replicas.allreduce_sum(s, 2 * c + 1);
    detail::check_synchronized_count(c, s[2 * c], replicas.size());
    invstd_.reserve_discard(c);
    detail::cpu_for_each(c, kernels::batch_norm_moments<T>{s, c, g_.eps, momentum, mean_.data(), invstd_.data(),
                                                           running_mean, running_var});
    for (std::size_t k = 0; k < c; ++k) {  // the variance batch_norm_moments took 1 / sqrt(v + eps) of
      const double m = s[k] / s[2 * c], v = s[c + k] / s[2 * c] - m * m;
      var_.data()[k] = static_cast<T>(v > 0 ? v : 0);
    }
  }

  /// After oneDNN's backward with the group's statistics: dparams_ holds this rank's sums of
  /// dy * xhat and of dy (its weight and bias gradients) and dx this rank's input gradient as if
  /// its batch were the whole, w invstd (dy - sum(dy) / n - xhat sum(dy xhat) / n). Adds the
  /// sums up over the replicas and corrects dx to the group's count N and sums:
  /// dx += w invstd ((sum(dy) / n - SUM(dy) / N) + xhat (sum(dy xhat) / n - SUM(dy xhat) / N)),
  /// one pass of a + b x per channel. Every rank takes part in the sums, dx or not.
  void synchronize_input_gradient(const T* x, const cpu_format& xf, const T* w, T* dx, std::size_t batch,
                                  process_group& replicas) {
    const std::size_t c = g_.c;
    const T* dscale = dparams_.data();
    const T* dshift = dparams_.data() + c;
    grad_sums_.reserve_discard(2 * c);
    double* s = grad_sums_.data();
    for (std::size_t k = 0; k < c; ++k) s[k] = dshift[k], s[c + k] = dscale[k];
    replicas.allreduce_sum(s, 2 * c);
    if (!dx) return;
    const double n = static_cast<double>(batch * g_.spatial()), total = sums_.data()[2 * c];
    coefficients_.reserve_discard(2 * c);
    T* a = coefficients_.data();
    T* bx = coefficients_.data() + c;
    for (std::size_t k = 0; k < c; ++k) {
      const double is = invstd_.data()[k], scale = static_cast<double>(w[k]) * is;
      const double k0 = dshift[k] / n - s[k] / total, k1 = dscale[k] / n - s[c + k] / total;
      // w invstd (k0 + (x - mean) invstd k1) = a + b x
      bx[k] = static_cast<T>(scale * is * k1);
      a[k] = static_cast<T>(scale * (k0 - is * k1 * static_cast<double>(mean_.data()[k])));
    }
    const std::size_t blk = block(xf, batch);
    if (blk == c && c != 8 && c != 16) return add_affine_channels_last(x, a, bx, dx, batch);
    switch (blk) {
      case 16: return add_affine<16>(x, a, bx, dx, batch);
      case 8: return add_affine<8>(x, a, bx, dx, batch);
      default: return add_affine<1>(x, a, bx, dx, batch);
    }
  }

  /// add_affine over a channels-last activation (one block of every channel, a bf16
  /// convolution's output): each pixel's C values in a row, the inner loop over them.
  void add_affine_channels_last(const T* x, const T* a, const T* b, T* dx, std::size_t batch) const {
    const std::size_t c = g_.c, rows = batch * g_.spatial();
    const auto n = static_cast<std::ptrdiff_t>(rows);
#pragma omp parallel for schedule(static) if (rows * c >= detail::parallel_threshold)
    for (std::ptrdiff_t r = 0; r < n; ++r) {
      const T* xr = x + static_cast<std::size_t>(r) * c;
      T* dr = dx + static_cast<std::size_t>(r) * c;
#pragma omp simd
      for (std::size_t j = 0; j < c; ++j) dr[j] += a[j] + b[j] * xr[j];
    }
  }

  /// dx += a[c] + b[c] x, element by element, over an activation whose channels come in blocks
  /// of Block (1: plain): each (sample, block of channels) is one contiguous run of
  /// spatial * Block values, the inner loop of a compile-time width so that it vectorises.
  template <std::size_t Block>
  void add_affine(const T* x, const T* a, const T* b, T* dx, std::size_t batch) const {
    const std::size_t spatial = g_.spatial(), groups = g_.c / Block, runs = batch * groups;
    const auto n = static_cast<std::ptrdiff_t>(runs);
#pragma omp parallel for schedule(static) if (runs * spatial * Block >= detail::parallel_threshold)
    for (std::ptrdiff_t r = 0; r < n; ++r) {
      const std::size_t c0 = static_cast<std::size_t>(r) % groups * Block;
      const std::size_t base = static_cast<std::size_t>(r) * spatial * Block;
      const T* xr = x + base;
      T* dr = dx + base;
      if constexpr (Block == 1) {
        const T ak = a[c0], bk = b[c0];
#pragma omp simd
        for (std::size_t p = 0; p < spatial; ++p) dr[p] += ak + bk * xr[p];
      } else {
        T ak[Block], bk[Block];
        for (std::size_t j = 0; j < Block; ++j) ak[j] = a[c0 + j], bk[j] = b[c0 + j];
        for (std::size_t p = 0; p < spatial; ++p) {
#pragma omp simd
          for (std::size_t j = 0; j < Block; ++j) dr[p * Block + j] += ak[j] + bk[j] * xr[p * Block + j];
        }
      }
    }
  }

  struct no_vendor {  // double: oneDNN has no f64 batch norm
    explicit no_vendor(batch_norm_geometry) {}
    void fuse_relu() {}
  };

  batch_norm_geometry g_;
  std::conditional_t<vendor, detail::dnnl_batch_norm, no_vendor> dnnl_;
  detail::batch_norm_kernels<T, detail::cpu_launcher> kernels_;
  path mode_ = vendor ? path::vendor : path::kernels;
  bool inference_ = false;
  bool relu_ = false;
  bool synchronized_ = false;  // the last training forward's statistics were the group's
  const T* running_mean_ = nullptr;  // those of the last evaluation forward (oneDNN's)
  const T* running_var_ = nullptr;
  buffer<T> mean_, var_;      // (C) each: the last training forward's statistics (oneDNN's)
  buffer<float> workspace_;   // the fused ReLU's mask (bytes, in floats)
  buffer<T> dx_scratch_;      // (batch, In): the input gradient nobody asked for (a first layer)
  buffer<T> dparams_;         // (2C): the parameter gradients before they are added
  // Synchronized: this rank's statistics as sums, then the group's (2C + 1, double); the
  // group's gradient sums (2C, double); 1 / std (C); the input gradient's correction (2C).
  // The rows path: its sums (sums_, grad_sums_ as above), each share's partial sums
  // (batch_norm_rows_partials), 1 / std, and per channel a, b, d (backward) and forward's scale
  // and shift.
  buffer<double> sums_, grad_sums_, partials_;
  buffer<T> invstd_, coefficients_;
  // The rows path's bf16 copies of y and dx (asked for under bf16 math: the copies a bf16
  // convolution next to it reads, activation::bf16), and where the last ones are (null: none).
  buffer<std::uint16_t> output_copy_, gradient_copy_;
  const std::uint16_t* output_bf16_ = nullptr;
  const std::uint16_t* input_gradient_bf16_ = nullptr;
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/batch_norm.ipp"
#endif
