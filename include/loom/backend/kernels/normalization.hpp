// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel bodies of layer normalisation over each sample's Width features: one sample per call
// for the statistics and the input gradient, one feature per call for gain and bias gradients.

#include <cmath>
#include <cstddef>

#include "loom/core/config.hpp"

namespace loom::kernels {

/// y = (x - mean) * rstd * gain + bias, saving mean and rstd per sample.
template <class T>
struct layer_norm_forward_row {
  const T* x;
  const T* gain;
  const T* bias;
  T* y;
  T* mean;
  T* rstd;
  std::size_t width;
  T eps;
  LOOM_HD void operator()(std::size_t n) const {
    const T* r = x + n * width;
    T m = 0;
    for (std::size_t j = 0; j < width; ++j) m += r[j];
    m /= static_cast<T>(width);
    T v = 0;
    for (std::size_t j = 0; j < width; ++j) v += (r[j] - m) * (r[j] - m);
    v /= static_cast<T>(width);
    const T s = T(1) / std::sqrt(v + eps);
    mean[n] = m;
    rstd[n] = s;
    for (std::size_t j = 0; j < width; ++j) y[n * width + j] = (r[j] - m) * s * gain[j] + bias[j];
  }
};

/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * gain.
template <class T>
struct layer_norm_backward_row {
  const T* x;
  const T* gain;
  const T* dy;
  const T* mean;
  const T* rstd;
  T* dx;
  std::size_t width;
  LOOM_HD void operator()(std::size_t n) const {
    const T* r = x + n * width;
    const T* d = dy + n * width;
    T sg = 0, sgx = 0;
    for (std::size_t j = 0; j < width; ++j) {
      const T xhat = (r[j] - mean[n]) * rstd[n];
      const T g = d[j] * gain[j];
      sg += g;
      sgx += g * xhat;
    }
    const T inv = T(1) / static_cast<T>(width);
    for (std::size_t j = 0; j < width; ++j) {
      const T xhat = (r[j] - mean[n]) * rstd[n];
      dx[n * width + j] = rstd[n] * (d[j] * gain[j] - sg * inv - xhat * sgx * inv);
    }
  }
};

/// dgain[j] (+)= sum_n dy * xhat; dbias[j] (+)= sum_n dy.
template <class T>
struct layer_norm_param_grad {
  const T* x;
  const T* dy;
  const T* mean;
  const T* rstd;
  T* dgain;
  T* dbias;
  std::size_t batch, width;
  bool accumulate;
  LOOM_HD void operator()(std::size_t j) const {
    T sg = 0, sb = 0;
    for (std::size_t n = 0; n < batch; ++n) {
      const T xhat = (x[n * width + j] - mean[n]) * rstd[n];
      sg += dy[n * width + j] * xhat;
      sb += dy[n * width + j];
    }
    dgain[j] = accumulate ? dgain[j] + sg : sg;
    dbias[j] = accumulate ? dbias[j] + sb : sb;
  }
};

}  // namespace loom::kernels
