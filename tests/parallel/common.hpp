// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the data-parallel tests: the example's networks, a small training set, and the
// single-process reference run that every multi-rank run must reproduce.

#include <cmath>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/loom.hpp"

namespace loom_test {

using mlp = example::mlp;
using cnn = example::cnn;

/// The same networks with smooth activations and average pooling. Float sums over a batch split
/// across ranks round differently (~1e-9 relative per step); in a ReLU or max-pool network such
/// a difference sometimes flips a kink (a pre-activation crossing 0, a near-tie in a pooling
/// window), which moves one gradient element by O(1) and is then amplified by training:
/// measured here for the example's cnn, 2 ranks against 1, 6e-8 after 20 steps but 6.4e-4
/// after 50 (2.6e-5 after 36); with tanh and average pooling 1.7e-7 after 50. The smooth
/// variants test the arithmetic of data parallelism over long runs; the ReLU ones over as
/// many steps as that arithmetic, not chaos, decides.
using smooth_mlp = loom::network<loom::input<784>, loom::linear<256>, loom::tanh, loom::linear<128>, loom::tanh, loom::linear<10>>;
using smooth_cnn = loom::network<loom::input<1, 28, 28>, loom::conv2d<32, 3, 1, 1>, loom::tanh, loom::avg_pool2d<2>,
                                 loom::conv2d<64, 3, 1, 1>, loom::tanh, loom::avg_pool2d<2>, loom::flatten,
                                 loom::linear<128>, loom::tanh, loom::linear<10>>;

inline const loom::data::fashion_mnist_set& train_set() {
  // 3,200 images: 50 steps of 64 in one epoch.
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(3200);
  return s;
}

inline loom::fit_options steps(std::size_t n, std::size_t batch, std::size_t accumulation = 1) {
  loom::fit_options o;
  o.epochs = 100;
  o.max_steps = n;
  o.batch = batch;
  o.accumulation = accumulation;
  o.progress = nullptr;
  return o;
}

/// ||a - b|| / ||b||.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}

/// The parameters after training Net alone for `n` steps of `batch`.
template <class Net, class Optimizer = loom::sgd>
std::vector<float> reference(std::size_t n, std::size_t batch, typename Optimizer::options opt = {.lr = 0.02f, .momentum = 0.9f}) {
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer> t{opt, {.seed = 1, .threads = 1}};
  t.fit(train_set(), steps(n, batch));
  auto p = t.model().parameters();
  return {p.begin(), p.end()};
}

}  // namespace loom_test
