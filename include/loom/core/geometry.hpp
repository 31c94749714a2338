// SPDX-License-Identifier: Apache-2.0
#pragma once
// The sizes of a convolution or a pooling, shared by the layers that compute them at compile
// time and the backends that run them.

#include <cstddef>

namespace loom {

/// One convolution: input (c, h, w), oc output channels, a k x k window, stride, padding.
struct conv2d_geometry {
  std::size_t c, h, w, oc, k, stride, pad;
  constexpr std::size_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  constexpr std::size_t ow() const { return (w + 2 * pad - k) / stride + 1; }
  constexpr std::size_t weight_count() const { return oc * c * k * k; }
};

enum class pool_kind { max, average };

/// One pooling: input (c, h, w), a k x k window moved by stride, no padding.
struct pool2d_geometry {
  std::size_t c, h, w, k, stride;
  constexpr std::size_t oh() const { return (h - k) / stride + 1; }
  constexpr std::size_t ow() const { return (w - k) / stride + 1; }
};

}  // namespace loom
