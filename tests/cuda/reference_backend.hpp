// SPDX-License-Identifier: Apache-2.0
#pragma once
// A serial host backend for the GPU check (benchmarks/gpu/gpu_check.cu): the same kernel bodies
// as loom::cpu and loom::cuda run in plain loops, matrix products and convolutions as direct
// loops (accumulating in double; in math_mode::bf16 over operands rounded to bf16 first, the
// rounding loom::cpu and loom::cuda apply). It needs nothing but a C++ compiler (no oneDNN, no OpenMP), so
// the check can compare loom::cuda against it on any machine with a GPU; reference_test.cpp
// checks it against loom::cpu. Slow; for checks only.

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "loom/backend/batch_norm_kernels.hpp"
#include "loom/backend/kernels/pool.hpp"
#include "loom/core/error.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/memory.hpp"

namespace loom::gpu_check {

/// v as a product sees it in math mode m: rounded to bf16 in bf16 mode (float only).
template <class T>
double operand(T v, math_mode m) {
  if constexpr (std::is_same_v<T, float>)
    if (m == math_mode::bf16) return static_cast<double>(detail::round_to_bf16(v));
  return static_cast<double>(v);
}

struct reference_format {
  constexpr bool plain() const noexcept { return true; }
  friend constexpr bool operator==(const reference_format&, const reference_format&) noexcept { return true; }
};

template <class T>
class reference_conv2d_plan {
 public:
  explicit reference_conv2d_plan(conv2d_geometry g) : g_(g) {}
  void fuse_relu() { relu_ = true; }

  reference_format forward(const T* x, const reference_format&, const T* w, const T* b, T* y, std::size_t batch,
                           math_mode m = math_mode::fp32) {
    const std::size_t oh = g_.oh(), ow = g_.ow();
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t o = 0; o < g_.oc; ++o)
        for (std::size_t i = 0; i < oh; ++i)
          for (std::size_t j = 0; j < ow; ++j) {
            double s = b ? b[o] : 0.0;
            for (std::size_t c = 0; c < g_.c; ++c)
              for (std::size_t p = 0; p < g_.k; ++p)
                for (std::size_t q = 0; q < g_.k; ++q) {
                  std::size_t xi;
                  if (!at(n, c, i, j, p, q, xi)) continue;
                  s += operand(x[xi], m) * operand(w[((o * g_.c + c) * g_.k + p) * g_.k + q], m);
                }
            T v = static_cast<T>(s);
            if (relu_ && v < T(0)) v = T(0);
            y[((n * g_.oc + o) * oh + i) * ow + j] = v;
          }
    return {};
  }

  /// In bf16 mode dy, x and w enter rounded (the bias gradient too sums the rounded dy, as
  /// oneDNN's bf16 convolution does).
  void backward(const T* x, const reference_format&, const T* w, const T* dy, T* dx, T* dw, T* db, std::size_t batch,
                bool accumulate, math_mode m = math_mode::fp32) {
    const std::size_t oh = g_.oh(), ow = g_.ow();
    if (dx) std::memset(dx, 0, batch * g_.c * g_.h * g_.w * sizeof(T));
    if (!accumulate) {
      std::memset(dw, 0, g_.weight_count() * sizeof(T));
      if (db) std::memset(db, 0, g_.oc * sizeof(T));
    }
    for (std::size_t n = 0; n < batch; ++n)
      for (std::size_t o = 0; o < g_.oc; ++o)
        for (std::size_t i = 0; i < oh; ++i)
          for (std::size_t j = 0; j < ow; ++j) {
            const T d = static_cast<T>(operand(dy[((n * g_.oc + o) * oh + i) * ow + j], m));
            if (db) db[o] += d;
            for (std::size_t c = 0; c < g_.c; ++c)
              for (std::size_t p = 0; p < g_.k; ++p)
                for (std::size_t q = 0; q < g_.k; ++q) {
                  std::size_t xi;
                  if (!at(n, c, i, j, p, q, xi)) continue;
                  const std::size_t wi = ((o * g_.c + c) * g_.k + p) * g_.k + q;
                  dw[wi] += d * static_cast<T>(operand(x[xi], m));
                  if (dx) dx[xi] += d * static_cast<T>(operand(w[wi], m));
                }
          }
  }

 private:
  bool at(std::size_t n, std::size_t c, std::size_t i, std::size_t j, std::size_t p, std::size_t q, std::size_t& xi) const {
    const auto yy = static_cast<std::ptrdiff_t>(i * g_.stride + p) - static_cast<std::ptrdiff_t>(g_.pad);
    const auto xx = static_cast<std::ptrdiff_t>(j * g_.stride + q) - static_cast<std::ptrdiff_t>(g_.pad);
    if (yy < 0 || xx < 0 || yy >= static_cast<std::ptrdiff_t>(g_.h) || xx >= static_cast<std::ptrdiff_t>(g_.w)) return false;
    xi = ((n * g_.c + c) * g_.h + static_cast<std::size_t>(yy)) * g_.w + static_cast<std::size_t>(xx);
    return true;
  }

  conv2d_geometry g_;
  bool relu_ = false;
};

template <class T>
class reference_pool2d_plan {
 public:
  reference_pool2d_plan(pool2d_geometry g, pool_kind kind) : g_(g), kind_(kind) {}
  reference_format forward(const T* x, const reference_format&, T* y, std::size_t batch) {
    const kernels::pool_planes p = planes(batch);
    for (std::size_t i = 0; i < p.planes * p.oh * p.ow; ++i) {
      if (kind_ == pool_kind::max)
        kernels::max_pool_forward<T, 1>{x, y, p}(i);
      else
        kernels::avg_pool_forward<T, 1>{x, y, p}(i);
    }
    return {};
  }
  void backward(const T* x, const reference_format&, const T* dy, T* dx, std::size_t batch) {
    const kernels::pool_planes p = planes(batch);
    for (std::size_t i = 0; i < p.planes; ++i) {
      if (kind_ == pool_kind::max)
        kernels::max_pool_backward<T, 1>{x, dy, dx, p}(i);
      else
        kernels::avg_pool_backward<T, 1>{dy, dx, p}(i);
    }
  }

 private:
  kernels::pool_planes planes(std::size_t batch) const {
    return {batch * g_.c, g_.h, g_.w, g_.oh(), g_.ow(), g_.k, g_.stride, g_.pad};
  }
  pool2d_geometry g_;
  pool_kind kind_;
};

struct reference;

/// Batch normalisation by loom's kernel bodies (backend/batch_norm_kernels.hpp), serially: what
/// loom::cuda runs for statistics summed over replicas, and loom::cpu for double.
template <class T>
class reference_batch_norm_plan {
 public:
  explicit reference_batch_norm_plan(batch_norm_geometry g) : k_(g) {}
  void fuse_relu() { k_.fuse_relu(); }
  reference_format forward_training(const T* x, const reference_format&, const T* w, const T* b, T* y, T* running_mean,
                                    T* running_var, double momentum, std::size_t batch, process_group* replicas) {
    k_.forward_training(x, 1, w, b, y, running_mean, running_var, momentum, batch, replicas);
    return {};
  }
  reference_format forward_inference(const T* x, const reference_format&, const T* w, const T* b, const T* running_mean,
                                     const T* running_var, T* y, std::size_t batch) {
    k_.forward_inference(x, 1, w, b, running_mean, running_var, y, batch);
    return {};
  }
  void backward(const T* x, const reference_format&, const T* w, const T*, const T* dy, T* dx, T* dw, T* db,
                std::size_t batch, bool accumulate, process_group* replicas) {
    k_.backward(x, 1, w, dy, dx, dw, db, batch, accumulate, replicas);
  }

 private:
  detail::batch_norm_kernels<T, reference> k_;
};

/// Serial execution on the host; memory in host_space.
struct reference {
  static constexpr const char* name = "reference";
  using memory_space = host_space;
  using format = reference_format;
  template <class T>
  using conv2d_plan = reference_conv2d_plan<T>;
  template <class T>
  using pool2d_plan = reference_pool2d_plan<T>;
  template <class T>
  using batch_norm_plan = reference_batch_norm_plan<T>;
  static constexpr std::size_t channel_block(const format&, std::size_t, std::size_t, std::size_t, std::size_t) {
    return 1;
  }

  template <class F>
  static void for_each(std::size_t n, F f) {
    for (std::size_t i = 0; i < n; ++i) f(i);
  }
  template <class F>
  static double sum(std::size_t n, F f) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(f(i));
    return s;
  }
  /// Row-major C = alpha op(A) op(B) + beta C, accumulated in double (over bf16-rounded A and
  /// B in math_mode::bf16).
  template <class T>
  static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                   std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc,
                   math_mode math = math_mode::fp32) {
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::size_t p = 0; p < k; ++p)
          s += operand(trans_a ? a[p * lda + i] : a[i * lda + p], math) *
               operand(trans_b ? b[j * ldb + p] : b[p * ldb + j], math);
        c[i * ldc + j] = static_cast<T>(alpha * s + (beta == T(0) ? 0.0 : static_cast<double>(beta * c[i * ldc + j])));
      }
  }
  /// Every math mode: bf16 is a rounding of the operands here.
  static bool supports(math_mode) { return true; }
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src) std::memcpy(dst, src, n * sizeof(T));
  }
  template <class T>
  static void zero(T* dst, std::size_t n) {
    if (n) std::memset(dst, 0, n * sizeof(T));
  }

  class layout_converter {
   public:
    template <class T, class Shape>
    const T* to_plain(const T* x, const format&, std::size_t) {
      return x;
    }
    template <class T, class Shape>
    void from_plain(const T* src, const format&, T* dst, std::size_t batch) {
      copy(dst, src, batch * Shape::size);
    }
    template <class T, class Shape>
    void convert(const T* src, const format&, T* dst, const format&, std::size_t batch) {
      copy(dst, src, batch * Shape::size);
    }
  };
};

}  // namespace loom::gpu_check
