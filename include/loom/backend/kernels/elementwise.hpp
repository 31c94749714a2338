// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small element-wise kernel bodies shared by several layers: bias broadcast and reduction,
// addition, dropout masks. Written once; every backend's launcher runs them.

#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/random.hpp"

namespace loom::kernels {

/// y[n, j] = b[j] for a (batch, Width) y: the start of y = x W^T + b. One row per call.
template <class T, std::size_t Width>
struct broadcast_row {
  const T* b;
  T* y;
  LOOM_HD void operator()(std::size_t n) const {
    T* r = y + n * Width;
    for (std::size_t j = 0; j < Width; ++j) r[j] = b[j];
  }
};

/// db[j] (+)= sum over n of dy[n, j], for a (batch, width) dy.
template <class T>
struct sum_rows {
  const T* dy;
  T* db;
  std::size_t batch, width;
  bool accumulate;
  LOOM_HD void operator()(std::size_t j) const {
    T s = 0;
    for (std::size_t n = 0; n < batch; ++n) s += dy[n * width + j];
    db[j] = accumulate ? db[j] + s : s;
  }
};

/// y[n, c, p] += b[c] for a plain (batch, Channels, Pixels) y, then ReLU when Relu: the bias
/// (and fused ReLU) of a convolution whose vendor call wrote y without them.
template <class T, bool Relu>
struct add_channel_bias {
  T* y;
  const T* b;
  std::size_t channels, pixels;
  LOOM_HD void operator()(std::size_t i) const {
    T v = y[i] + b[(i / pixels) % channels];
    if constexpr (Relu) v = v > T(0) ? v : T(0);
    y[i] = v;
  }
};

/// z = x + y.
template <class T>
struct add {
  const T* x;
  const T* y;
  T* z;
  LOOM_HD void operator()(std::size_t i) const { z[i] = x[i] + y[i]; }
};

/// z = max(x + y, 0): a residual's sum with the ReLU after it fused in.
template <class T>
struct add_relu {
  const T* x;
  const T* y;
  T* z;
  LOOM_HD void operator()(std::size_t i) const {
    const T v = x[i] + y[i];
    z[i] = v > T(0) ? v : T(0);
  }
};

/// z = x + y, or max(x + y, 0) when Relu, and z16 = z rounded to bf16 (detail::bf16_bits, as
/// oneDNN's reorder rounds): a residual's sum with the copy the bf16 convolutions after it read.
template <bool Relu>
struct add_with_bf16 {
  const float* x;
  const float* y;
  float* z;
  std::uint16_t* z16;
  LOOM_HD void operator()(std::size_t i) const {
    float v = x[i] + y[i];
    if constexpr (Relu) v = v > 0.0f ? v : 0.0f;
    z[i] = v;
    z16[i] = detail::bf16_bits(v);
  }
};

/// z = (x + y) relu'(r): two gradients of a ReLU's output r added and taken through the ReLU,
/// the bits of kernels::add then pointwise_backward<relu_op> (which multiplies by r > 0 ? 1 : 0).
template <class T>
struct add_relu_gradient {
  const T* x;
  const T* y;
  const T* r;
  T* z;
  LOOM_HD void operator()(std::size_t i) const { z[i] = (x[i] + y[i]) * (r[i] > T(0) ? T(1) : T(0)); }
};

/// Inverted dropout: keeps an element with probability 1 - rate and scales it by 1 / (1 - rate).
/// The mask is a pure function of (seed, stream, index), so backward recomputes it.
template <class T>
struct dropout_apply {
  const T* in;
  T* out;
  std::uint64_t seed, stream;
  double rate;
  std::size_t first;  // index of element 0 within the global batch
  LOOM_HD void operator()(std::size_t i) const {
    const bool keep = uniform01(counter_hash(seed, stream, first + i)) >= rate;
    out[i] = keep ? static_cast<T>(in[i] / (1.0 - rate)) : T(0);
  }
};

}  // namespace loom::kernels
