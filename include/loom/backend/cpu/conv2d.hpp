// SPDX-License-Identifier: Apache-2.0
#pragma once
// 2-D convolution on the CPU: forward, backward-data and backward-weights. float runs oneDNN
// primitives (created once per batch size, input layout and math mode, then reused) and keeps
// the output in the layout oneDNN prefers; in math_mode::bf16 the primitives take bf16 inputs
// (x, w, dy, converted by reorders) and write float outputs and gradients. double, for
// gradient checks, runs a direct reference loop.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/core/config.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/memory.hpp"

namespace loom {

/// How the CPU backend computes its float convolutions in fp32 math.
/// - automatic (the default): oneDNN's Winograd F(4x4, 3x3) kernels (AVX-512) for the 3x3,
///   stride-1, padding-1 convolutions where they were measured faster than the direct ones in
///   forward and both gradients together (detail::conv2d_winograd_pays: 48+ channels, or 32+ at
///   20x20+ output pixels; 4x4+ output pixels; 32+ tiles of 4x4 output pixels in the batch per
///   thread, at least 64), direct elsewhere. About half the time of the direct kernels at
///   ResNet-18's 64 channels by 16x16 or 56x56 and 128 by 8x8 or 28x28, batch 32-64, 1 or 2
///   threads (benchmarks/README.md). Rounding errors about 4x the direct ones' (1e-6 of the
///   largest output against 3e-7, 64 channels, normal inputs): those convolutions' results are
///   not the direct ones' bits, and which algorithm runs depends on the batch (a short last
///   batch, or a rank's share of one, may run direct where the full batch runs Winograd).
/// - direct: oneDNN's direct convolutions everywhere (and, for a weight gradient of few output
///   pixels, a matmul over x's columns), what PyTorch runs on the CPU: the same algorithm
///   whatever the batch.
/// - winograd: Winograd for every 3x3, stride-1, padding-1 convolution of at least 32 input and
///   output channels and 4x4 output pixels, whatever the batch and threads (slower than direct
///   at small batches: 512 channels at 7x7, batch 4, takes 2.3x the direct time); the others
///   stay direct.
/// On a CPU without oneDNN's Winograd kernels (AVX2) all three run direct. bf16 math is not
/// affected (oneDNN has no bf16 Winograd).
enum class conv_algorithm { automatic, direct, winograd };

namespace detail {
inline conv_algorithm& conv_algorithm_setting() {
  static conv_algorithm a = conv_algorithm::automatic;
  return a;
}
}  // namespace detail

/// Sets the algorithm for the convolutions' oneDNN primitives created after the call: a
/// convolution creates them at its first batch of each size, so call it before training (as
/// set_threads). Programs with several threads calling it while others train get either.
inline void set_conv_algorithm(conv_algorithm a) { detail::conv_algorithm_setting() = a; }
inline conv_algorithm get_conv_algorithm() { return detail::conv_algorithm_setting(); }

namespace detail {

/// Whether conv_algorithm::winograd runs convolution g by Winograd: 3x3, stride 1, padding 1,
/// at least 32 input and output channels and 4x4 output pixels. Measured against the direct
/// kernels (oneDNN 2.6, batch 64, one thread, forward / input gradient / weight gradient, ms):
/// 64 channels at 16x16 6.8/6.7/6.5 -> 3.6/3.5/4.0; 128 at 8x8 6.2/6.1/6.5 -> 3.3/3.3/3.3; 256
/// at 4x4 6.0/4.7/8.4 -> 4.5/4.5/3.1; 64 at 7x7 1.1/1.1/1.3 -> 0.9/0.9/1.0; 32 at 14x14
/// 1.2/2.2/1.2 -> 1.2/1.2/1.2. Slower below: 512 at 2x2 6.6/4.0 -> 17.7/16.8, and 16 at 28x28
/// 1.3/5.0 -> 1.8/56.9.
inline bool conv2d_winograd_suits(const conv2d_geometry& g) {
  return g.k == 3 && g.stride == 1 && g.pad == 1 && g.c >= 32 && g.oc >= 32 && g.oh() >= 4 && g.ow() >= 4;
}

/// Whether conv_algorithm::automatic runs convolution g by Winograd for `batch` samples on
/// `threads` threads: where it suits (above) and the three passes together were measured faster
/// than direct — at least 48 channels (in and out), or 32 with at least 400 output pixels; and
/// at least 32 tiles (4x4 output pixels each, over the batch) per thread, 64 at the least.
/// Measured (oneDNN 2.6, AVX-512, the three passes' time over the direct ones'; 1 thread, and 2
/// where named): tiles decide — 512 channels at 7x7 (4 tiles a sample) 6.5 at batch 1, 2.3 at
/// 4, 1.3 at 8, 0.92 at 16 (2 threads 0.90), 0.70 at 32; 256 at 14x14 (16) 1.6, 1.1, 0.78 at
/// 1, 2, 4 (2 threads 0.62 at 4); 128 at 8x8 (4) 4.2 at 1, 0.94 at 8, 0.75 at 16 (2 threads
/// 1.12 at 4, 0.71 at 16); 512 at 4x4 (1) 0.98 at 32, 0.69 at 64; 64 at 16x16 0.98 at 2, 0.77
/// at 4; 64 at 56x56 0.53 at 1, 0.46-0.49 at 8-32. Few channels gain less: 32 at 14x14 1.19 at
/// 16 and 0.97-1.02 at 32-64 (1 and 2 threads); 32 at 28x28 0.79 at 4, 0.62 at 16; 48 at 14x14
/// 0.79 at 32. Beyond 2 threads (not measured) each thread keeps as many tiles as at 2.
inline bool conv2d_winograd_pays(const conv2d_geometry& g, std::size_t batch, std::size_t threads) {
  if (!conv2d_winograd_suits(g)) return false;
  const std::size_t channels = std::min(g.c, g.oc), pixels = g.oh() * g.ow();
  const std::size_t tiles = batch * ((g.oh() + 3) / 4) * ((g.ow() + 3) / 4);
  if (tiles < 32 * std::max<std::size_t>(threads, 2)) return false;
  return channels >= 48 || pixels >= 400;
}

/// Whether a float convolution g of `batch` samples on `threads` threads, in fp32 math, asks
/// oneDNN for Winograd under algorithm a (each pass runs direct where oneDNN has no Winograd
/// kernel for it).
inline bool conv2d_winograd_wanted(conv_algorithm a, const conv2d_geometry& g, std::size_t batch, std::size_t threads) {
  switch (a) {
    case conv_algorithm::automatic: return conv2d_winograd_pays(g, batch, threads);
    case conv_algorithm::winograd: return conv2d_winograd_suits(g);
    case conv_algorithm::direct: return false;
  }
  return false;
}

/// Reference convolution over plain NCHW data, in any scalar type.
template <class T>
struct conv2d_reference {
  static void forward(const conv2d_geometry& g, std::size_t batch, const T* x, const T* w, const T* b, T* y) {
    const std::size_t oh = g.oh(), ow = g.ow();
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t o = 0; o < g.oc; ++o)
        for (std::size_t i = 0; i < oh; ++i)
          for (std::size_t j = 0; j < ow; ++j) {
            T s = b ? b[o] : T(0);
            for (std::size_t c = 0; c < g.c; ++c)
              for (std::size_t p = 0; p < g.k; ++p)
                for (std::size_t q = 0; q < g.k; ++q) {
                  const std::ptrdiff_t yy = static_cast<std::ptrdiff_t>(i * g.stride + p) - static_cast<std::ptrdiff_t>(g.pad);
                  const std::ptrdiff_t xx = static_cast<std::ptrdiff_t>(j * g.stride + q) - static_cast<std::ptrdiff_t>(g.pad);
                  if (yy < 0 || xx < 0 || yy >= static_cast<std::ptrdiff_t>(g.h) || xx >= static_cast<std::ptrdiff_t>(g.w)) continue;
                  s += x[((n * g.c + c) * g.h + static_cast<std::size_t>(yy)) * g.w + static_cast<std::size_t>(xx)] *
                       w[((o * g.c + c) * g.k + p) * g.k + q];
                }
            y[((n * g.oc + o) * oh + i) * ow + j] = s;
          }
  }
  /// dx (if non-null) is overwritten; dw, db are overwritten or added to (accumulate).
  static void backward(const conv2d_geometry& g, std::size_t batch, const T* x, const T* w, const T* dy, T* dx, T* dw,
                       T* db, bool accumulate) {
    const std::size_t oh = g.oh(), ow = g.ow();
    if (dx) std::memset(dx, 0, batch * g.c * g.h * g.w * sizeof(T));
    if (!accumulate) {
      std::memset(dw, 0, g.weight_count() * sizeof(T));
      if (db) std::memset(db, 0, g.oc * sizeof(T));
    }
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t o = 0; o < g.oc; ++o)
        for (std::size_t i = 0; i < oh; ++i)
          for (std::size_t j = 0; j < ow; ++j) {
            const T d = dy[((n * g.oc + o) * oh + i) * ow + j];
            if (db) db[o] += d;
            for (std::size_t c = 0; c < g.c; ++c)
              for (std::size_t p = 0; p < g.k; ++p)
                for (std::size_t q = 0; q < g.k; ++q) {
                  const std::ptrdiff_t yy = static_cast<std::ptrdiff_t>(i * g.stride + p) - static_cast<std::ptrdiff_t>(g.pad);
                  const std::ptrdiff_t xx = static_cast<std::ptrdiff_t>(j * g.stride + q) - static_cast<std::ptrdiff_t>(g.pad);
                  if (yy < 0 || xx < 0 || yy >= static_cast<std::ptrdiff_t>(g.h) || xx >= static_cast<std::ptrdiff_t>(g.w)) continue;
                  const std::size_t xi = ((n * g.c + c) * g.h + static_cast<std::size_t>(yy)) * g.w + static_cast<std::size_t>(xx);
                  const std::size_t wi = ((o * g.c + c) * g.k + p) * g.k + q;
                  dw[wi] += d * x[xi];
                  if (dx) dx[xi] += d * w[wi];
                }
          }
  }
};


/// float convolutions through oneDNN primitives, created once per batch size, input layout and
/// math mode, then reused (impl/conv2d.ipp). cpu_conv2d_plan<float> runs on it.
class dnnl_conv2d {
 public:
  LOOM_DECL explicit dnnl_conv2d(conv2d_geometry g);
  LOOM_DECL dnnl_conv2d(dnnl_conv2d&&) noexcept;
  LOOM_DECL dnnl_conv2d& operator=(dnnl_conv2d&&) noexcept;
  LOOM_DECL ~dnnl_conv2d();

  LOOM_DECL void fuse_relu();
  LOOM_DECL cpu_format forward(const float* x, const cpu_format& xf, const float* w, const float* b, float* y,
                               std::size_t batch, math_mode math, const std::uint16_t* x_bf16 = nullptr);
  LOOM_DECL void backward(const float* x, const cpu_format& xf, const float* w, const float* dy, float* dx, float* dw,
                          float* db, std::size_t batch, bool accumulate, math_mode math,
                          const std::uint16_t* dy_bf16 = nullptr);
  /// The oneDNN implementations (or loom's matmul) that run forward, the input gradient and the
  /// weight gradient for this batch, layout and math mode: "fwd ... bwd_d ... bwd_w ...".
  LOOM_DECL std::string implementations(std::size_t batch, const cpu_format& xf, math_mode math);

  /// Whether this batch, layout and math mode's passes, given the bf16 copies of their operands,
  /// read those alone: x's (forward's x_bf16: forward and the weight gradient take x in bf16 in
  /// x's own layout) and dy's (backward's dy_bf16: the input and weight gradients take dy so).
  /// Then the layer that writes x, or dy, need write the copy alone. Creates the primitives if
  /// need be; false for both outside bf16 math.
  struct copy_reads {
    bool input = false, output_gradient = false;
  };
  LOOM_DECL copy_reads reads_copies_only(std::size_t batch, const cpu_format& xf, math_mode math);

 private:
  struct entry;  // the primitives of one (batch, layout, math mode), and their scratch

  /// x's columns (bf16, (N*OH*OW) x (K*K*C)) for the matmul paths: made anew in forward, reused
  /// by the backward of the same x.
  LOOM_DECL const void* columns_of(entry& e, const float* x, std::size_t batch, bool backward);
  LOOM_DECL cpu_format forward_by_matmul(entry& e, const float* x, const float* w, const float* b, float* y,
                                         std::size_t batch);
  LOOM_DECL void input_gradient_by_matmul(entry& e, const float* w, const void* dy_bf16, float* dx, std::size_t batch);
  LOOM_DECL void backward_weights_by_matmul(entry& e, const float* x, const void* dy_rows, float* dw,
                                            float* db, std::size_t batch, bool accumulate);
  entry& get(std::size_t batch, const cpu_format& xf, math_mode math);

  conv2d_geometry g_;
  bool relu_ = false;
  std::vector<std::unique_ptr<entry>> entries_;
};

/// The reference loops as a plan, for T other than float (gradient checks in double).
template <class T>
class reference_conv2d {
 public:
  explicit reference_conv2d(conv2d_geometry g) : g_(g) {}
  void fuse_relu() { relu_ = true; }
  cpu_format forward(const T* x, const cpu_format&, const T* w, const T* b, T* y, std::size_t batch, math_mode) {
    conv2d_reference<T>::forward(g_, batch, x, w, b, y);
    if (relu_)
      for (std::size_t i = 0; i < batch * g_.oc * g_.oh() * g_.ow(); ++i) y[i] = y[i] > T(0) ? y[i] : T(0);
    return {};
  }
  void backward(const T* x, const cpu_format&, const T* w, const T* dy, T* dx, T* dw, T* db, std::size_t batch,
                bool accumulate, math_mode) {
    conv2d_reference<T>::backward(g_, batch, x, w, dy, dx, dw, db, accumulate);
  }

 private:
  conv2d_geometry g_;
  bool relu_ = false;
};

}  // namespace detail

/// A convolution of fixed geometry, ready to run on batches. One per conv2d layer. float runs
/// oneDNN's primitives (detail::dnnl_conv2d, compiled once with loom::compiled), any other T
/// the reference loops.
template <class T>
class cpu_conv2d_plan {
 public:
  explicit cpu_conv2d_plan(conv2d_geometry g) : g_(g), run_(g) {}

  /// Makes forward write relu(conv(x) + b): the ReLU of the next layer, fused so the output
  /// is written once. Call before the first forward.
  void fuse_relu() { run_.fuse_relu(); }

  /// y = conv(x, w) + b. x is in layout xf; returns the layout y was written in. In
  /// math_mode::bf16 (float only) x and w enter the convolution rounded to bf16; x_bf16, when
  /// given, is x so rounded already (detail::bf16_bits of each value, in layout xf: what
  /// activation::bf16 holds), read instead of converting x where the convolution takes x in xf's
  /// layout, and kept to backward (so it must stay unchanged until then, as x must).
  /// Throws loom::invalid_argument for bf16 on a CPU without oneDNN bf16 convolutions.
  cpu_format forward(const T* x, const cpu_format& xf, const T* w, const T* b, T* y, std::size_t batch,
                     math_mode math = math_mode::fp32, const std::uint16_t* x_bf16 = nullptr) {
    if constexpr (std::is_same_v<T, float>) return run_.forward(x, xf, w, b, y, batch, math, x_bf16);
    else return run_.forward(x, xf, w, b, y, batch, math);
  }

  /// Given dy (in the layout forward returned), writes dx (in layout xf) when dx is non-null,
  /// and dw, db — overwritten, or added to when accumulate is true. x is forward's input. In
  /// math_mode::bf16 x, w and dy enter the products rounded to bf16 (dy_bf16, when given: dy so
  /// rounded already, in dy's layout, read where the products take that layout); dx, dw, db
  /// are float.
  void backward(const T* x, const cpu_format& xf, const T* w, const T* dy, T* dx, T* dw, T* db, std::size_t batch,
                bool accumulate, math_mode math = math_mode::fp32, const std::uint16_t* dy_bf16 = nullptr) {
    if constexpr (std::is_same_v<T, float>) run_.backward(x, xf, w, dy, dx, dw, db, batch, accumulate, math, dy_bf16);
    else run_.backward(x, xf, w, dy, dx, dw, db, batch, accumulate, math);
  }

  const conv2d_geometry& geometry() const { return g_; }

  /// float: which kernels run this convolution for a batch of that size in layout xf and math
  /// mode (detail::dnnl_conv2d::implementations), creating them if need be.
  std::string implementations(std::size_t batch, const cpu_format& xf, math_mode math = math_mode::fp32)
    requires std::is_same_v<T, float>
  {
    return run_.implementations(batch, xf, math);
  }

  /// float: detail::dnnl_conv2d::reads_copies_only — whether forward, given x_bf16, and
  /// backward, given dy_bf16, read nothing else of x and dy.
  detail::dnnl_conv2d::copy_reads reads_copies_only(std::size_t batch, const cpu_format& xf, math_mode math)
    requires std::is_same_v<T, float>
  {
    return run_.reads_copies_only(batch, xf, math);
  }

 private:
  conv2d_geometry g_;
  std::conditional_t<std::is_same_v<T, float>, detail::dnnl_conv2d, detail::reference_conv2d<T>> run_;
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/conv2d.ipp"
#endif
