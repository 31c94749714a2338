// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU execution space: loom::cpu. Element-wise kernel bodies (backend/kernels/) run through
// its launcher on the OpenMP pool; matrix products and convolutions go to oneDNN.

#include <cstddef>
#include <cstring>

#include <omp.h>

#include "loom/backend/cpu/batch_norm.hpp"
#include "loom/backend/cpu/conv2d.hpp"
#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/backend/cpu/gemm.hpp"
#include "loom/backend/cpu/launch.hpp"
#include "loom/backend/cpu/pool2d.hpp"
#include "loom/backend/cpu/runtime.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/shape.hpp"

namespace loom {

namespace detail {

// cpu::for_each's loops, compiled three times — for AVX-512, AVX2 and the baseline x86-64 — and
// run for the widest this CPU has (cpu_vector_level): the element-wise kernel bodies inline into
// them and vectorise at that width (the rest of a program is compiled for the baseline). Each
// iteration is independent (a kernel body's contract), so the loops are marked simd; and no
// a * b + c is contracted to a fused multiply-add (fp-contract=off), so an element's result is
// the baseline's, bit for bit, at any width and on any ISA (an SGD step p - lr g rounded once
// would differ from the one the tests and the other paths compute, and a vector loop's fused
// body from its scalar remainder's).
#define LOOM_CPU_FOR_EACH(name, target)                                              \
  template <class F>                                                                  \
  target void name(std::size_t n, const F& body) {                                    \
    if (n < parallel_threshold || omp_get_max_threads() == 1) {                       \
      _Pragma("omp simd") for (std::size_t i = 0; i < n; ++i) body(i);                \
      return;                                                                         \
    }                                                                                 \
    const auto sn = static_cast<std::ptrdiff_t>(n);                                   \
    _Pragma("omp parallel for simd schedule(static)") for (std::ptrdiff_t i = 0; i < sn; ++i) \
        body(static_cast<std::size_t>(i));                                            \
  }
LOOM_CPU_FOR_EACH(cpu_for_each_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,prefer-vector-width=512"),
                                                     optimize("fp-contract=off"))))
LOOM_CPU_FOR_EACH(cpu_for_each_avx2, __attribute__((target("avx2,fma"), optimize("fp-contract=off"))))
#undef LOOM_CPU_FOR_EACH

}  // namespace detail

/// Execution on the host's cores. Memory lives in host_space.
struct cpu {
  static constexpr const char* name = "cpu";
  using memory_space = host_space;
  /// The physical layout of an activation (plain, or one oneDNN chose).
  using format = cpu_format;
  template <class T>
  using conv2d_plan = cpu_conv2d_plan<T>;
  template <class T>
  using pool2d_plan = cpu_pool2d_plan<T>;
  template <class T>
  using batch_norm_plan = cpu_batch_norm_plan<T>;
  /// A bf16 convolution reads its input's bf16 copy when the layer before wrote one
  /// (activation::bf16) rather than converting the float values itself.
  static constexpr bool reads_bf16_copies = true;

  /// The channels per block of an (n, c, h, w) activation in format f: 1 when plain, 8 or 16 in
  /// oneDNN's nChw8c / nChw16c, c in channels-last (nhwc, one block of every channel: what bf16
  /// convolutions write) — what loom's channel-wise kernel bodies read.
  /// Throws loom::backend_error for another layout.
  static std::size_t channel_block(const format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
    return detail::cpu_channel_block(f, n, c, h, w);
  }

  /// Runs f(i) for every i in [0, n).
  template <class F>
  static void for_each(std::size_t n, F f) {
    switch (detail::cpu_vector_level()) {
      case 2: return detail::cpu_for_each_avx512(n, f);
      case 1: return detail::cpu_for_each_avx2(n, f);
      default: return detail::cpu_for_each(n, f);
    }
  }
  /// The sum of f(i) over [0, n), in double.
  template <class F>
  static double sum(std::size_t n, F f) {
    return detail::cpu_sum(n, f);
  }
  /// Row-major C = alpha op(A) op(B) + beta C. In math_mode::bf16 (float only) A and B are
  /// rounded to bf16 and the products summed in float; C stays float.
  /// Throws loom::invalid_argument for bf16 on a CPU without oneDNN bf16 support.
  template <class T>
  static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                   std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc,
                   math_mode math = math_mode::fp32) {
    detail::cpu_gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, math);
  }
  /// Whether this CPU runs `math`: fp32 always; bf16 where oneDNN has bf16 primitives
  /// (AVX-512 and later: avx512_core, fast with avx512_bf16 or amx_bf16).
  static bool supports(math_mode math) { return math == math_mode::fp32 || detail::bf16_gemm::available(); }
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src) std::memcpy(dst, src, n * sizeof(T));
  }
  template <class T>
  static void zero(T* dst, std::size_t n) {
    if (n) std::memset(dst, 0, n * sizeof(T));
  }

  /// Converts between the layout of a (batch, Shape) activation and plain row-major. Reorders
  /// are cached; a plain activation is passed through without a copy.
  class layout_converter {
   public:
    template <class T, class Shape>
    const T* to_plain(const T* x, const format& f, std::size_t batch) {
      if (f.plain()) return x;
      if constexpr (std::is_same_v<T, float> && Shape::rank == 3) {
        float* out = plain_.get(batch * Shape::size);
        reorders_.run(f, x, format{}, out, batch, Shape::dims[0], Shape::dims[1], Shape::dims[2]);
        return out;
      } else {
        throw backend_error("loom: internal error: a non-plain layout on a tensor that cannot have one");
      }
    }
    /// Writes plain data `src` into `dst` in layout f (a copy when f is plain).
    template <class T, class Shape>
    void from_plain(const T* src, const format& f, T* dst, std::size_t batch) {
      if (f.plain()) return copy(dst, src, batch * Shape::size);
      if constexpr (std::is_same_v<T, float> && Shape::rank == 3) {
        reorders_.run(format{}, src, f, dst, batch, Shape::dims[0], Shape::dims[1], Shape::dims[2]);
      } else {
        throw backend_error("loom: internal error: a non-plain layout on a tensor that cannot have one");
      }
    }
    /// Copies src in layout `from` to dst in layout `to`.
    template <class T, class Shape>
    void convert(const T* src, const format& from, T* dst, const format& to, std::size_t batch) {
      if (from == to) return copy(dst, src, batch * Shape::size);
      if constexpr (std::is_same_v<T, float> && Shape::rank == 3) {
        reorders_.run(from, src, to, dst, batch, Shape::dims[0], Shape::dims[1], Shape::dims[2]);
      } else {
        throw backend_error("loom: internal error: a non-plain layout on a tensor that cannot have one");
      }
    }

   private:
    detail::layout_reorders reorders_;
    detail::scratch plain_;
  };
};

}  // namespace loom
