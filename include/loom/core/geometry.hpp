// SPDX-License-Identifier: Apache-2.0
#pragma once
// The sizes of a convolution or a pooling, shared by the layers that compute them at compile
// time and the backends that run them.

#include <cstddef>

namespace loom {

/// One convolution: input (c, h, w), oc output channels, a k x k window, stride, padding, and
/// whether it adds a bias per output channel.
struct conv2d_geometry {
  std::size_t c, h, w, oc, k, stride, pad;
  bool bias = true;
  constexpr std::size_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  constexpr std::size_t ow() const { return (w + 2 * pad - k) / stride + 1; }
  constexpr std::size_t weight_count() const { return oc * c * k * k; }
};

enum class pool_kind { max, average };

/// One pooling: input (c, h, w), a k x k window moved by stride, pad on every side (never read).
struct pool2d_geometry {
  std::size_t c, h, w, k, stride;
  std::size_t pad = 0;
  constexpr std::size_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  constexpr std::size_t ow() const { return (w + 2 * pad - k) / stride + 1; }
};

/// One batch normalization: c channels of `spatial` values per sample each (h x w of an image,
/// 1 for a vector of features, which rank 1 marks).
struct batch_norm_geometry {
  std::size_t c, h = 1, w = 1;
  std::size_t rank = 3;  // of one sample: 1 (features) or 3 (channels, height, width)
  double eps = 1e-5;     // added to the variance
  constexpr std::size_t spatial() const { return h * w; }
};

}  // namespace loom
