// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel bodies of 2-D max and average pooling, and of global average pooling, over a
// channel-blocked layout: element (n, c, h, w) sits at (((n * CB + c / Block) * H + h) * W + w) * Block + c % Block, CB being
// C / Block. Block = 1 is plain NCHW; 8 and 16 are oneDNN's nChw8c / nChw16c; Block = C is
// channels-last (nhwc). The 2-D poolings also read channels-last in blocks of 8 or 16 channels
// (pool_planes::channels_last): the same loops with a pixel pitch of C. The innermost loop runs
// over the Block channels, which are contiguous, so it vectorises.

#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"

// A loop over a block's channels, vectorised on the CPU (the kernels run there inside loops
// compiled for the CPU's widest vector ISA: backend/cpu/pool2d.hpp).
#if defined(__CUDA_ARCH__)
#define LOOM_CHANNEL_SIMD
#else
#define LOOM_CHANNEL_SIMD _Pragma("omp simd")
#endif

namespace loom::kernels {

/// The sizes of one pooling over planes of Block channels. Windows start at -pad: the padding is
/// never read (max pooling takes the maximum of the window's inside, as PyTorch's -inf padding
/// does; average pooling divides by k * k, PyTorch's count_include_pad).
struct pool_planes {
  std::size_t planes;  // batch * C / Block
  std::size_t h, w, oh, ow, k, stride;
  std::size_t pad = 0;
  /// 0: a blocked layout, plane after plane. Otherwise channels-last with this many blocks of
  /// Block channels per pixel (C / Block): plane p is block p % blocks of sample p / blocks,
  /// its pixels C values apart.
  std::size_t channels_last = 0;

  /// Where plane p of an input (in) or output (out) starts, and how far apart its pixels are.
  template <std::size_t Block>
  LOOM_HD std::size_t in_plane(std::size_t p) const { return plane_at<Block>(p, h * w); }
  template <std::size_t Block>
  LOOM_HD std::size_t out_plane(std::size_t p) const { return plane_at<Block>(p, oh * ow); }
  template <std::size_t Block>
  LOOM_HD std::size_t pitch() const { return channels_last ? channels_last * Block : Block; }

 private:
  template <std::size_t Block>
  LOOM_HD std::size_t plane_at(std::size_t p, std::size_t pixels) const {
    return channels_last ? (p / channels_last * pixels * channels_last + p % channels_last) * Block : p * pixels * Block;
  }
};

/// The rows (or columns) [first, last) of a window's k that lie inside an input of n, for the
/// window starting at o * stride - pad.
struct pool_window {
  std::size_t first, last;
  LOOM_HD static pool_window of(std::size_t o, std::size_t stride, std::size_t pad, std::size_t k, std::size_t n) {
    const std::size_t start = o * stride;  // in padded coordinates
    const std::size_t first = start < pad ? pad - start : 0;
    const std::size_t end = start + k;     // padded; the input ends at n + pad
    const std::size_t last = end > n + pad ? k - (end - (n + pad)) : k;
    return {first, last};
  }
};

/// Max pooling, one output pixel (all Block channels) per call. Its loops over the channels are
/// marked to vectorise: without it g++ 12 took the maximum a channel at a time (ResNet-18 fp32,
/// one thread: 1.24% of a step -> 0.55%).
template <class T, std::size_t Block>
struct max_pool_forward {
  const T* x;
  T* y;
  pool_planes g;
  LOOM_HD_INLINE void operator()(std::size_t i) const {
    const std::size_t ow = i % g.ow, oh = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const std::size_t pitch = g.template pitch<Block>();
    const T* in = x + g.template in_plane<Block>(plane);
    const pool_window rows = pool_window::of(oh, g.stride, g.pad, g.k, g.h);
    const pool_window cols = pool_window::of(ow, g.stride, g.pad, g.k, g.w);
    const std::size_t top = oh * g.stride - g.pad, left = ow * g.stride - g.pad;  // wrap around, undone below
    T best[Block];
    const T* first = in + ((top + rows.first) * g.w + left + cols.first) * pitch;
    LOOM_CHANNEL_SIMD
    for (std::size_t c = 0; c < Block; ++c) best[c] = first[c];
    for (std::size_t p = rows.first; p < rows.last; ++p)
      for (std::size_t q = cols.first; q < cols.last; ++q) {
        const T* src = in + ((top + p) * g.w + left + q) * pitch;
        LOOM_CHANNEL_SIMD
        for (std::size_t c = 0; c < Block; ++c) best[c] = src[c] > best[c] ? src[c] : best[c];
      }
    T* out = y + g.template out_plane<Block>(plane) + (oh * g.ow + ow) * pitch;
    LOOM_CHANNEL_SIMD
    for (std::size_t c = 0; c < Block; ++c) out[c] = best[c];
  }
};

/// Max pooling backward, one plane per call (windows may overlap, planes never do): dx is
/// zeroed, then each output's gradient goes to the first maximum of its window, found again
/// in x — cheaper than storing positions in forward, which then stays a pure max.
template <class T, std::size_t Block>
struct max_pool_backward {
  const T* x;
  const T* dy;
  T* dx;
  pool_planes g;
  LOOM_HD_INLINE void operator()(std::size_t plane) const {
    const std::size_t pitch = g.template pitch<Block>();
    const T* in = x + g.template in_plane<Block>(plane);
    T* din = dx + g.template in_plane<Block>(plane);
    for (std::size_t j = 0; j < g.h * g.w; ++j)
      for (std::size_t c = 0; c < Block; ++c) din[j * pitch + c] = T(0);
    for (std::size_t oh = 0; oh < g.oh; ++oh)
      for (std::size_t ow = 0; ow < g.ow; ++ow) {
        const std::size_t o = g.template out_plane<Block>(plane) + (oh * g.ow + ow) * pitch;
        const pool_window rows = pool_window::of(oh, g.stride, g.pad, g.k, g.h);
        const pool_window cols = pool_window::of(ow, g.stride, g.pad, g.k, g.w);
        const std::size_t top = oh * g.stride - g.pad, left = ow * g.stride - g.pad;  // wrap around, undone below
        const std::size_t corner = ((top + rows.first) * g.w + left + cols.first) * pitch;
        T best[Block];
        std::size_t at[Block];
        LOOM_CHANNEL_SIMD
        for (std::size_t c = 0; c < Block; ++c) best[c] = in[corner + c], at[c] = corner + c;
        for (std::size_t p = rows.first; p < rows.last; ++p)
          for (std::size_t q = cols.first; q < cols.last; ++q) {
            const std::size_t base = ((top + p) * g.w + left + q) * pitch;
            LOOM_CHANNEL_SIMD
            for (std::size_t c = 0; c < Block; ++c) {
              const bool more = in[base + c] > best[c];
              best[c] = more ? in[base + c] : best[c];
              at[c] = more ? base + c : at[c];
            }
          }
        for (std::size_t c = 0; c < Block; ++c) din[at[c]] += dy[o + c];
      }
  }
};

/// Average pooling, one output pixel (all Block channels) per call.
template <class T, std::size_t Block>
struct avg_pool_forward {
  const T* x;
  T* y;
  pool_planes g;
  LOOM_HD_INLINE void operator()(std::size_t i) const {
    const std::size_t ow = i % g.ow, oh = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const std::size_t pitch = g.template pitch<Block>();
    const T* in = x + g.template in_plane<Block>(plane);
    const pool_window rows = pool_window::of(oh, g.stride, g.pad, g.k, g.h);
    const pool_window cols = pool_window::of(ow, g.stride, g.pad, g.k, g.w);
    const std::size_t top = oh * g.stride - g.pad, left = ow * g.stride - g.pad;  // wrap around, undone below
    T sum[Block];
    for (std::size_t c = 0; c < Block; ++c) sum[c] = T(0);
    for (std::size_t p = rows.first; p < rows.last; ++p)
      for (std::size_t q = cols.first; q < cols.last; ++q) {
        const T* src = in + ((top + p) * g.w + left + q) * pitch;
        LOOM_CHANNEL_SIMD
        for (std::size_t c = 0; c < Block; ++c) sum[c] += src[c];
      }
    const T inv = T(1) / static_cast<T>(g.k * g.k);
    T* out = y + g.template out_plane<Block>(plane) + (oh * g.ow + ow) * pitch;
    for (std::size_t c = 0; c < Block; ++c) out[c] = sum[c] * inv;
  }
};

/// Average pooling backward, one plane per call: each output's gradient is shared equally by
/// its window.
template <class T, std::size_t Block>
struct avg_pool_backward {
  const T* dy;
  T* dx;
  pool_planes g;
  LOOM_HD_INLINE void operator()(std::size_t plane) const {
    const std::size_t pitch = g.template pitch<Block>();
    T* din = dx + g.template in_plane<Block>(plane);
    for (std::size_t j = 0; j < g.h * g.w; ++j)
      for (std::size_t c = 0; c < Block; ++c) din[j * pitch + c] = T(0);
    const T inv = T(1) / static_cast<T>(g.k * g.k);
    for (std::size_t oh = 0; oh < g.oh; ++oh)
      for (std::size_t ow = 0; ow < g.ow; ++ow) {
        const std::size_t o = g.template out_plane<Block>(plane) + (oh * g.ow + ow) * pitch;
        const pool_window rows = pool_window::of(oh, g.stride, g.pad, g.k, g.h);
        const pool_window cols = pool_window::of(ow, g.stride, g.pad, g.k, g.w);
        const std::size_t top = oh * g.stride - g.pad, left = ow * g.stride - g.pad;  // wrap around, undone below
        for (std::size_t p = rows.first; p < rows.last; ++p)
          for (std::size_t q = cols.first; q < cols.last; ++q) {
            T* dst = din + ((top + p) * g.w + left + q) * pitch;
            LOOM_CHANNEL_SIMD
            for (std::size_t c = 0; c < Block; ++c) dst[c] += dy[o + c] * inv;
          }
      }
  }
};

/// Global average pooling of a (batch, C, spatial) activation whose channels come in blocks of
/// Block (1: plain NCHW) into a plain (batch, C): one (sample, channel block) per call, the
/// Block channels' sums side by side.
template <class T, std::size_t Block>
struct global_avg_pool_forward {
  const T* x;
  T* y;
  std::size_t channels, spatial;
  LOOM_HD_INLINE void operator()(std::size_t i) const {  // i = n * (channels / Block) + cb
    const T* in = x + i * spatial * Block;
    T sum[Block];
    for (std::size_t c = 0; c < Block; ++c) sum[c] = T(0);
    for (std::size_t s = 0; s < spatial; ++s)
      for (std::size_t c = 0; c < Block; ++c) sum[c] += in[s * Block + c];
    const T inv = T(1) / static_cast<T>(spatial);
    const std::size_t blocks = channels / Block, n = i / blocks, cb = i % blocks;
    for (std::size_t c = 0; c < Block; ++c) y[n * channels + cb * Block + c] = sum[c] * inv;
  }
};

/// Its backward: each input element's gradient is its (sample, channel)'s dy over spatial, in
/// the input's layout. One (sample, channel block) per call, as forward: the Block values
/// computed once and written to each of its spatial places.
template <class T, std::size_t Block>
struct global_avg_pool_backward {
  const T* dy;
  T* dx;
  std::size_t channels, spatial;
  LOOM_HD_INLINE void operator()(std::size_t i) const {  // i = n * (channels / Block) + cb
    const std::size_t blocks = channels / Block, n = i / blocks, cb = i % blocks;
    T g[Block];
    for (std::size_t c = 0; c < Block; ++c) g[c] = dy[n * channels + cb * Block + c] / static_cast<T>(spatial);
    T* out = dx + i * spatial * Block;
    for (std::size_t s = 0; s < spatial; ++s)
      for (std::size_t c = 0; c < Block; ++c) out[s * Block + c] = g[c];
  }
};

}  // namespace loom::kernels
