// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel bodies of the point-wise activations, written once for every backend: each op has
// f(x) and its derivative df(x, y) with y = f(x); the launchers map them over a buffer.

#include <cmath>
#include <cstddef>

#include "loom/core/config.hpp"

namespace loom::kernels {

struct relu_op {
  template <class T>
  LOOM_HD static T f(T x) { return x > T(0) ? x : T(0); }
  template <class T>
  LOOM_HD static T df(T x, T) { return x > T(0) ? T(1) : T(0); }
};

/// Leaky ReLU with slope SlopeMillis / 1000 for negative inputs.
template <int SlopeMillis>
struct leaky_relu_op {
  template <class T>
  LOOM_HD static T f(T x) { return x > T(0) ? x : x * (T(SlopeMillis) / T(1000)); }
  template <class T>
  LOOM_HD static T df(T x, T) { return x > T(0) ? T(1) : T(SlopeMillis) / T(1000); }
};

struct tanh_op {
  template <class T>
  LOOM_HD static T f(T x) { return std::tanh(x); }
  template <class T>
  LOOM_HD static T df(T, T y) { return T(1) - y * y; }
};

struct sigmoid_op {
  template <class T>
  LOOM_HD static T f(T x) {
    // Stable on both tails: exp() only ever sees a non-positive argument.
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
  }
  template <class T>
  LOOM_HD static T df(T, T y) { return y * (T(1) - y); }
};

/// GELU, the exact form x * Phi(x) (as PyTorch's default).
struct gelu_op {
  template <class T>
  LOOM_HD static T f(T x) { return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440))); }
  template <class T>
  LOOM_HD static T df(T x, T) {
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
    const T pdf = T(0.39894228040143267794) * std::exp(T(-0.5) * x * x);
    return cdf + x * pdf;
  }
};

template <class Op, class T>
struct pointwise_forward {
  const T* x;
  T* y;
  LOOM_HD void operator()(std::size_t i) const { y[i] = Op::f(x[i]); }
};

template <class Op, class T>
struct pointwise_backward {
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  LOOM_HD void operator()(std::size_t i) const {
    const T xi = x[i], yi = y[i];
    const T slope = Op::df(xi, yi);
    dx[i] = dy[i] * slope;
  }
};

}  // namespace loom::kernels
