// SPDX-License-Identifier: Apache-2.0
#pragma once
// 2-D max and average pooling on the CPU (padding never read), run by loom's own kernel bodies
// (backend/kernels/pool.hpp) directly on the layout the input arrives in — plain NCHW,
// oneDNN's channel-blocked nChw8c / nChw16c, or channels-last (nhwc, a bf16 convolution's) — so
// the output keeps that layout and nothing is reordered. (oneDNN's pooling was measured 3-5x slower than these loops for training here.)
// The loops are compiled for AVX-512, AVX2 and the baseline, and the widest the CPU has runs.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/backend/cpu/launch.hpp"
#include "loom/backend/kernels/pool.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/memory.hpp"

namespace loom {

namespace detail {

// The pooling loops: kernel body k for i in [0, n), in parallel when `work` (values touched) pays
// for it, compiled three times — for AVX-512, AVX2 and the baseline — and run for the widest this
// CPU has (cpu_vector_level), as batch_norm_rows is: the kernels' loops over a block's channels
// then vectorise. The OpenMP loop sits in each function itself, so that its body is compiled for
// that function's ISA (and the kernel body, LOOM_HD_INLINE, inlined into it). No multiply-add is
// fused (fp-contract=off): average pooling gives the baseline's bits on any ISA.
#define LOOM_POOL_LOOP(name, target)                                                           \
  template <class K>                                                                          \
  target void name(std::size_t n, std::size_t work, const K& k) {                             \
    const auto m = static_cast<std::ptrdiff_t>(n);                                            \
    _Pragma("omp parallel for schedule(static) if (work >= parallel_threshold)")              \
    for (std::ptrdiff_t i = 0; i < m; ++i) k(static_cast<std::size_t>(i));                    \
  }
LOOM_POOL_LOOP(pool_loop_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,prefer-vector-width=512"),
                                                optimize("fp-contract=off"))))
LOOM_POOL_LOOP(pool_loop_avx2, __attribute__((target("avx2,fma"), optimize("fp-contract=off"))))
LOOM_POOL_LOOP(pool_loop_baseline, )
#undef LOOM_POOL_LOOP

template <class K>
void pool_loop(std::size_t n, std::size_t work, const K& k) {
  switch (cpu_vector_level()) {
    case 2: return pool_loop_avx512(n, work, k);
    case 1: return pool_loop_avx2(n, work, k);
    default: return pool_loop_baseline(n, work, k);
  }
}

}  // namespace detail

template <class T>
class cpu_pool2d_plan {
 public:
  cpu_pool2d_plan(pool2d_geometry g, pool_kind kind) : g_(g), kind_(kind) {}

  /// y = pool(x); x in layout xf. Returns y's layout.
  cpu_format forward(const T* x, const cpu_format& xf, T* y, std::size_t batch);

  /// dx (layout xf) from dy (the layout forward returned); x is forward's input.
  void backward(const T* x, const cpu_format& xf, const T* dy, T* dx, std::size_t batch);

 private:
  /// How the kernels walk layout f: planes of `block` channels (1 plain NCHW, 8 or 16 for
  /// oneDNN's blocked layouts and for channels-last, whose planes interleave).
  struct walk {
    std::size_t block;
    bool channels_last;
  };

  kernels::pool_planes planes(std::size_t batch, walk k) const {
    return {batch * g_.c / k.block, g_.h,     g_.w, g_.oh(), g_.ow(), g_.k, g_.stride,
            g_.pad,                 k.channels_last ? g_.c / k.block : 0};
  }

  walk walk_of(const cpu_format& f, std::size_t batch) const {
    if (f.plain()) return {1, false};
    const std::size_t b = detail::channel_block(f, batch, g_.c, g_.h, g_.w);
    if (b == g_.c && detail::is_channels_last(f, batch, g_.c, g_.h, g_.w))
      return {g_.c % 16 == 0 ? 16 : g_.c % 8 == 0 ? 8 : std::size_t{1}, true};
    if (b != 0) return {b, false};  // 8, 16; 1 without samples (nothing to read)
    throw backend_error("loom: pooling got an activation in a oneDNN layout it does not handle (only plain NCHW, "
                        "nChw8c, nChw16c and nhwc are); channels " + std::to_string(g_.c));
  }

  template <class F>
  static void dispatch(std::size_t block, F&& f) {
    if (block == 16)
      f.template operator()<16>();
    else if (block == 8)
      f.template operator()<8>();
    else
      f.template operator()<1>();
  }

  pool2d_geometry g_;
  pool_kind kind_;
  cpu_format out_;  // the layout forward last returned, for batch out_batch_
  std::size_t out_batch_ = 0, out_block_ = 0;
  bool out_channels_last_ = false;
};

// Out of the class, so not inline: with loom::compiled a program calls the library's
// cpu_pool2d_plan<float> rather than inlining the kernels into every model's passes.
template <class T>
cpu_format cpu_pool2d_plan<T>::forward(const T* x, const cpu_format& xf, T* y, std::size_t batch) {
  const walk k = walk_of(xf, batch);
  const kernels::pool_planes p = planes(batch, k);
  const std::size_t pixels = p.planes * p.oh * p.ow;
  const std::size_t work = pixels * g_.k * g_.k * k.block;
  dispatch(k.block, [&]<std::size_t B>() {
    if (kind_ == pool_kind::max)
      detail::pool_loop(pixels, work, kernels::max_pool_forward<T, B>{x, y, p});
    else
      detail::pool_loop(pixels, work, kernels::avg_pool_forward<T, B>{x, y, p});
  });
  if (xf.plain() || (k.block == 1 && !k.channels_last)) return {};  // (the latter: no samples)
  // made once per batch size and layout, not per call
  if (out_batch_ != batch || out_block_ != k.block || out_channels_last_ != k.channels_last) {
    out_ = k.channels_last ? detail::channels_last_nchw(batch, g_.c, g_.oh(), g_.ow())
                           : detail::blocked_nchw(batch, g_.c, g_.oh(), g_.ow(), k.block);
    out_batch_ = batch;
    out_block_ = k.block;
    out_channels_last_ = k.channels_last;
  }
  return out_;
}

template <class T>
void cpu_pool2d_plan<T>::backward(const T* x, const cpu_format& xf, const T* dy, T* dx, std::size_t batch) {
  const walk k = walk_of(xf, batch);
  const kernels::pool_planes p = planes(batch, k);
  // Per plane (windows overlap within a plane, never across): parallel over the planes when the
  // windows' values add up to enough work, however few the planes.
  const std::size_t work = p.planes * p.oh * p.ow * g_.k * g_.k * k.block;
  dispatch(k.block, [&]<std::size_t B>() {
    if (kind_ == pool_kind::max)
      detail::pool_loop(p.planes, work, kernels::max_pool_backward<T, B>{x, dy, dx, p});
    else
      detail::pool_loop(p.planes, work, kernels::avg_pool_backward<T, B>{dy, dx, p});
  });
}

LOOM_INSTANTIATE(class cpu_pool2d_plan<float>)

}  // namespace loom
