// SPDX-License-Identifier: Apache-2.0
#pragma once
// 2-D max and average pooling on the GPU: the kernel bodies of backend/kernels/pool.hpp (the
// ones the CPU runs) on plain NCHW data (Block = 1), launched as kernels. Needs nvcc.

#include <cstddef>

#include "loom/backend/cuda/conv2d.hpp"
#include "loom/backend/cuda/launch.hpp"
#include "loom/backend/kernels/pool.hpp"
#include "loom/core/geometry.hpp"

namespace loom {

template <class T>
class cuda_pool2d_plan {
 public:
  cuda_pool2d_plan(pool2d_geometry g, pool_kind kind) : g_(g), kind_(kind) {}

  /// y = pool(x), both plain. Forward runs one output pixel per thread.
  cuda_format forward(const T* x, const cuda_format&, T* y, std::size_t batch) {
    const kernels::pool_planes p = planes(batch);
    const std::size_t pixels = p.planes * p.oh * p.ow;
    if (kind_ == pool_kind::max)
      detail::cuda_for_each(pixels, kernels::max_pool_forward<T, 1>{x, y, p});
    else
      detail::cuda_for_each(pixels, kernels::avg_pool_forward<T, 1>{x, y, p});
    return {};
  }

  /// dx from dy; x is forward's input. One (image, channel) plane per thread: windows may
  /// overlap within a plane, never across planes.
  void backward(const T* x, const cuda_format&, const T* dy, T* dx, std::size_t batch) {
    const kernels::pool_planes p = planes(batch);
    if (kind_ == pool_kind::max)
      detail::cuda_for_each(p.planes, kernels::max_pool_backward<T, 1>{x, dy, dx, p});
    else
      detail::cuda_for_each(p.planes, kernels::avg_pool_backward<T, 1>{dy, dx, p});
  }

 private:
  kernels::pool_planes planes(std::size_t batch) const {
    return {batch * g_.c, g_.h, g_.w, g_.oh(), g_.ow(), g_.k, g_.stride, g_.pad};
  }

  pool2d_geometry g_;
  pool_kind kind_;
};

}  // namespace loom
