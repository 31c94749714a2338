// SPDX-License-Identifier: Apache-2.0
#pragma once
// The main example's two networks, one definition for the examples, the benchmarks and the
// tests that train "the example's mlp / cnn".

#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/network.hpp"

namespace example {

/// 784-256-128-10 with ReLU: 235,146 parameters.
using mlp = loom::network<loom::input<784>,
                          loom::linear<256>, loom::relu,
                          loom::linear<128>, loom::relu,
                          loom::linear<10>>;

/// Two 3x3 convolution + ReLU + 2x2 max-pool blocks (32, 64 channels), then 128 and 10.
using cnn = loom::network<loom::input<1, 28, 28>,
                          loom::conv2d<32, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::conv2d<64, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::flatten,
                          loom::linear<128>, loom::relu,
                          loom::linear<10>>;

}  // namespace example
