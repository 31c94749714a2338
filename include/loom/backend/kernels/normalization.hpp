// SPDX-License-Identifier: Apache-2.0
#pragma once
// Kernel bodies of layer normalisation over each sample's Width features (one sample per call
// for the statistics and the input gradient, one feature per call for gain and bias gradients),
// and of batch normalisation over each channel's values in a batch (one channel per call for
// the sums, one element per call for the normalisation and the input gradient).

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

// ---- Batch normalisation --------------------------------------------------------------------
// An activation of `batch` samples, each of `channels` channels of `spatial` values (an image's
// h * w; 1 for a vector of features), whose channels come in blocks of `block` (1: plain; 8 or 16:
// oneDNN's nChw8c, nChw16c): channel c of sample n at position s is element
// ((n * (channels / block) + c / block) * spatial + s) * block + c % block. Sums are in double,
// so the variance from them (E[x^2] - E[x]^2) keeps float's precision; they are what replicas
// that normalise over the global batch add up (synchronized batch norm): per channel the sum and
// the sum of squares, and the count of values, in forward; the sums of dy and of dy * xhat in
// backward.

/// The layout of a batch-normalised activation (see above).
struct channel_layout {
  std::size_t batch, channels, spatial, block;
  LOOM_HD std::size_t at(std::size_t n, std::size_t c, std::size_t s) const {
    return ((n * (channels / block) + c / block) * spatial + s) * block + c % block;
  }
  LOOM_HD std::size_t channel_of(std::size_t i) const {
    return (i / (block * spatial)) % (channels / block) * block + i % block;
  }
  LOOM_HD std::size_t size() const { return batch * channels * spatial; }
};

/// sums[c] = sum of channel c's values, sums[C + c] = sum of their squares, for c < C; call C
/// writes sums[2C] = the count of values per channel (batch * spatial). For_each over C + 1.
template <class T>
struct batch_norm_sums {
  const T* x;
  channel_layout l;
  double* sums;
  LOOM_HD void operator()(std::size_t c) const {
    if (c == l.channels) {
      sums[2 * l.channels] = static_cast<double>(l.batch * l.spatial);
      return;
    }
    double s = 0, q = 0;
    for (std::size_t n = 0; n < l.batch; ++n)
      for (std::size_t p = 0; p < l.spatial; ++p) {
        const double v = static_cast<double>(x[l.at(n, c, p)]);
        s += v;
        q += v * v;
      }
    sums[c] = s;
    sums[l.channels + c] = q;
  }
};

/// From the sums (batch_norm_sums, over this rank or over every replica): channel c's mean and
/// 1 / sqrt(var + eps), var the biased (population) variance; and, when running_mean is not
/// null, the running statistics moved toward the batch's as torch.nn.BatchNorm2d moves them:
/// mean' = (1 - momentum) mean' + momentum mean, var' = (1 - momentum) var' + momentum var * n / (n - 1)
/// (the unbiased variance).
template <class T>
struct batch_norm_moments {
  const double* sums;
  std::size_t channels;
  double eps, momentum;
  T* mean;
  T* invstd;
  T* running_mean;  // null: leave the running statistics
  T* running_var;
  LOOM_HD void operator()(std::size_t c) const {
    const double n = sums[2 * channels];
    const double m = sums[c] / n;
    double v = sums[channels + c] / n - m * m;
    v = v > 0 ? v : 0;
    mean[c] = static_cast<T>(m);
    invstd[c] = static_cast<T>(1 / std::sqrt(v + eps));
    if (running_mean) {
      running_mean[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_mean[c]) + momentum * m);
      running_var[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_var[c]) + momentum * v * n / (n - 1));
    }
  }
};

/// The running statistics moved toward a batch's mean and biased variance var over count values
/// (as batch_norm_moments moves them), for a backend whose vendor call computed those.
template <class T>
struct batch_norm_running_update {
  const T* mean;
  const T* var;
  T* running_mean;
  T* running_var;
  double momentum, count;
  LOOM_HD void operator()(std::size_t c) const {
    running_mean[c] =
        static_cast<T>((1 - momentum) * static_cast<double>(running_mean[c]) + momentum * static_cast<double>(mean[c]));
    running_var[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_var[c]) +
                                    momentum * static_cast<double>(var[c]) * count / (count - 1));
  }
};

/// Evaluation's statistics: mean = the running mean, invstd = 1 / sqrt(running var + eps).
template <class T>
struct batch_norm_running_moments {
  const T* running_mean;
  const T* running_var;
  double eps;
  T* mean;
  T* invstd;
  LOOM_HD void operator()(std::size_t c) const {
    mean[c] = running_mean[c];
    invstd[c] = static_cast<T>(1 / std::sqrt(static_cast<double>(running_var[c]) + eps));
  }
};

/// The batches a batch norm has normalised in training (PyTorch's num_batches_tracked), one more:
/// an integral value held in T. For_each over 1.
template <class T>
struct batch_norm_count {
  T* count;
  LOOM_HD void operator()(std::size_t) const { *count += T(1); }
};

/// y = (x - mean) * invstd * weight + bias, and its ReLU when relu. One element per call.
template <class T>
struct batch_norm_normalize {
  const T* x;
  const T* mean;
  const T* invstd;
  const T* weight;
  const T* bias;
  T* y;
  channel_layout l;
  bool relu;
  LOOM_HD void operator()(std::size_t i) const {
    const std::size_t c = l.channel_of(i);
    const T v = (x[i] - mean[c]) * invstd[c] * weight[c] + bias[c];
    y[i] = relu && !(v > T(0)) ? T(0) : v;
  }
};

/// sums[c] = sum of dy over channel c, sums[C + c] = sum of dy * xhat (xhat = (x - mean) invstd):
/// what backward needs of the whole batch. One channel per call.
template <class T>
struct batch_norm_gradient_sums {
  const T* x;
  const T* dy;
  const T* mean;
  const T* invstd;
  channel_layout l;
  double* sums;
  LOOM_HD void operator()(std::size_t c) const {
    double sd = 0, sdx = 0;
    for (std::size_t n = 0; n < l.batch; ++n)
      for (std::size_t p = 0; p < l.spatial; ++p) {
        const std::size_t i = l.at(n, c, p);
        const double d = static_cast<double>(dy[i]);
        sd += d;
        sdx += d * static_cast<double>((x[i] - mean[c]) * invstd[c]);
      }
    sums[c] = sd;
    sums[l.channels + c] = sdx;
  }
};

/// dweight[c] (+)= sum of dy * xhat, dbias[c] (+)= sum of dy, from batch_norm_gradient_sums.
template <class T>
struct batch_norm_parameter_gradients {
  const double* sums;
  std::size_t channels;
  T* dweight;
  T* dbias;
  bool accumulate;
  LOOM_HD void operator()(std::size_t c) const {
    const T dw = static_cast<T>(sums[channels + c]), db = static_cast<T>(sums[c]);
    dweight[c] = accumulate ? dweight[c] + dw : dw;
    dbias[c] = accumulate ? dbias[c] + db : db;
  }
};

/// Training's input gradient, the statistics depending on every value of the channel:
/// dx = weight invstd (dy - sum(dy) / n - xhat sum(dy xhat) / n), n the count of values the
/// statistics were taken over (sums[2C] of the forward's batch_norm_sums: the global batch's
/// when they were summed over replicas). With count null (evaluation: the running statistics
/// are constants), dx = weight invstd dy. One element per call.
template <class T>
struct batch_norm_input_gradient {
  const T* x;
  const T* dy;
  const T* mean;
  const T* invstd;
  const T* weight;
  const double* sums;        // batch_norm_gradient_sums
  const double* count;       // the forward's count of values per channel
  channel_layout l;
  T* dx;
  LOOM_HD void operator()(std::size_t i) const {
    const std::size_t c = l.channel_of(i);
    if (!count) {
      dx[i] = weight[c] * invstd[c] * dy[i];
      return;
    }
    const double inv_n = 1.0 / *count;
    const T xhat = (x[i] - mean[c]) * invstd[c];
    dx[i] = weight[c] * invstd[c] *
            (dy[i] - static_cast<T>(sums[c] * inv_n) - xhat * static_cast<T>(sums[l.channels + c] * inv_n));
  }
};

}  // namespace loom::kernels
