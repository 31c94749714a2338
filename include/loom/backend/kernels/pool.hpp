// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel bodies of 2-D max and average pooling over a channel-blocked layout: element
// (n, c, h, w) sits at (((n * CB + c / Block) * H + h) * W + w) * Block + c % Block, CB being
// C / Block. Block = 1 is plain NCHW; 8 and 16 are oneDNN's nChw8c / nChw16c. The innermost
// loop runs over the Block channels, which are contiguous, so it vectorises.

#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"

namespace loom::kernels {

/// The sizes of one pooling over planes of Block channels.
struct pool_planes {
  std::size_t planes;  // batch * C / Block
  std::size_t h, w, oh, ow, k, stride;
};

/// Max pooling, one output pixel (all Block channels) per call.
template <class T, std::size_t Block>
struct max_pool_forward {
  const T* x;
  T* y;
  pool_planes g;
  LOOM_HD void operator()(std::size_t i) const {
    const std::size_t ow = i % g.ow, oh = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const T* in = x + plane * g.h * g.w * Block;
    T best[Block];
    const T* first = in + ((oh * g.stride) * g.w + ow * g.stride) * Block;
    for (std::size_t c = 0; c < Block; ++c) best[c] = first[c];
    for (std::size_t p = 0; p < g.k; ++p)
      for (std::size_t q = 0; q < g.k; ++q) {
        const T* src = in + ((oh * g.stride + p) * g.w + ow * g.stride + q) * Block;
        for (std::size_t c = 0; c < Block; ++c) best[c] = src[c] > best[c] ? src[c] : best[c];
      }
    T* out = y + i * Block;
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
  LOOM_HD void operator()(std::size_t plane) const {
    const std::size_t plane_size = g.h * g.w * Block;
    const T* in = x + plane * plane_size;
    T* din = dx + plane * plane_size;
    for (std::size_t j = 0; j < plane_size; ++j) din[j] = T(0);
    for (std::size_t oh = 0; oh < g.oh; ++oh)
      for (std::size_t ow = 0; ow < g.ow; ++ow) {
        const std::size_t o = ((plane * g.oh + oh) * g.ow + ow) * Block;
        const std::size_t corner = (oh * g.stride * g.w + ow * g.stride) * Block;
        T best[Block];
        std::size_t at[Block];
        for (std::size_t c = 0; c < Block; ++c) best[c] = in[corner + c], at[c] = corner + c;
        for (std::size_t p = 0; p < g.k; ++p)
          for (std::size_t q = 0; q < g.k; ++q) {
            const std::size_t base = ((oh * g.stride + p) * g.w + ow * g.stride + q) * Block;
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
  LOOM_HD void operator()(std::size_t i) const {
    const std::size_t ow = i % g.ow, oh = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const T* in = x + plane * g.h * g.w * Block;
    T sum[Block];
    for (std::size_t c = 0; c < Block; ++c) sum[c] = T(0);
    for (std::size_t p = 0; p < g.k; ++p)
      for (std::size_t q = 0; q < g.k; ++q) {
        const T* src = in + ((oh * g.stride + p) * g.w + ow * g.stride + q) * Block;
        for (std::size_t c = 0; c < Block; ++c) sum[c] += src[c];
      }
    const T inv = T(1) / static_cast<T>(g.k * g.k);
    for (std::size_t c = 0; c < Block; ++c) y[i * Block + c] = sum[c] * inv;
  }
};

/// Average pooling backward, one plane per call: each output's gradient is shared equally by
/// its window.
template <class T, std::size_t Block>
struct avg_pool_backward {
  const T* dy;
  T* dx;
  pool_planes g;
  LOOM_HD void operator()(std::size_t plane) const {
    T* din = dx + plane * g.h * g.w * Block;
    for (std::size_t j = 0; j < g.h * g.w * Block; ++j) din[j] = T(0);
    const T inv = T(1) / static_cast<T>(g.k * g.k);
    for (std::size_t oh = 0; oh < g.oh; ++oh)
      for (std::size_t ow = 0; ow < g.ow; ++ow) {
        const std::size_t o = ((plane * g.oh + oh) * g.ow + ow) * Block;
        for (std::size_t p = 0; p < g.k; ++p)
          for (std::size_t q = 0; q < g.k; ++q) {
            T* dst = din + ((oh * g.stride + p) * g.w + ow * g.stride + q) * Block;
            for (std::size_t c = 0; c < Block; ++c) dst[c] += dy[o + c] * inv;
          }
      }
  }
};

}  // namespace loom::kernels
