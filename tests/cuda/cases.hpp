// SPDX-License-Identifier: Apache-2.0
#pragma once
// The cases the CUDA tests run on both backends: single layers and whole networks (one forward
// and backward from given parameters, input and output gradient), and short training runs.
// Declared here, defined in cases_impl.hpp, and instantiated once per backend in its own
// translation unit: cpu_side.cpp (g++, oneDNN) and cuda_side.cu (nvcc, whose front end cannot
// read oneDNN's header). This header names no backend's definition, so the Catch2 tests include
// it with plain g++.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/math_mode.hpp"
#include "loom/core/random.hpp"
#include "loom/core/shape.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/dropout.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/residual_with.hpp"
#include "loom/nn/network.hpp"

namespace loom {
struct cpu;
struct cuda;
}  // namespace loom

namespace loom::cuda_tests {

// Every layer alone (the first layer of a model gets no input gradient, so each runs through
// its sequence with one), then whole networks.
using linear_case = network<input<37>, linear<19>>;
// The ReLU fused into loom::cuda's linear forward: through cuBLASLt's epilogue (the bias at a
// 256-byte offset), and through the fallback (the bias at 140 bytes, less than 16-byte aligned).
using linear_relu_case = network<input<40>, linear<24>, relu>;
using linear_relu_unaligned_case = network<input<7>, linear<5>, relu>;
using conv_case = network<input<3, 10, 10>, conv2d<8, 3, 1, 1>>;
using conv_strided_case = network<input<4, 9, 9>, conv2d<5, 3, 2, 0>>;
using conv_wide_case = network<input<2, 11, 11>, conv2d<4, 5, 1, 2>>;
using conv_relu_case = network<input<3, 10, 10>, conv2d<8, 3, 1, 1>, relu>;  // the fused ReLU
using max_pool_case = network<input<3, 8, 8>, max_pool2d<2>>;
using max_pool_overlap_case = network<input<2, 9, 9>, max_pool2d<3, 2>>;
using avg_pool_case = network<input<3, 8, 8>, avg_pool2d<2>>;
using avg_pool_overlap_case = network<input<2, 9, 9>, avg_pool2d<3, 2>>;
using flatten_case = network<input<3, 4, 4>, flatten>;
using relu_case = network<input<50>, relu>;
using leaky_relu_case = network<input<50>, leaky_relu>;
using tanh_case = network<input<50>, loom::tanh>;
using sigmoid_case = network<input<50>, sigmoid>;
using gelu_case = network<input<50>, gelu>;
using dropout_case = network<input<64>, dropout>;
using layer_norm_case = network<input<3, 5, 5>, layer_norm>;
using residual_case = network<input<24>, residual<linear<24>, loom::tanh>>;
using mlp_case = network<input<64>, linear<48>, relu, linear<40>, leaky_relu, linear<32>, loom::tanh, linear<24>, sigmoid,
                         linear<16>, gelu, linear<10>>;
using cnn_case = network<input<3, 12, 12>, conv2d<8, 3, 1, 1>, relu, max_pool2d<2>, conv2d<6, 3, 2, 0>, loom::tanh,
                         avg_pool2d<2>, flatten, linear<5>>;
using mixed_case = network<input<2, 8, 8>, conv2d<4, 3, 1, 1>, layer_norm, residual<relu, conv2d<4, 3, 1, 1>>, dropout,
                           max_pool2d<3, 2>, flatten, linear<7>>;
// Batch norm in training (cuDNN's on the GPU, oneDNN's on the CPU, with the ReLU after it fused
// in on both), padded max pooling, and a ResNet block whose shortcut downsamples.
using batch_norm_case = network<input<6, 5, 5>, batch_norm>;
using batch_norm_relu_case = network<input<3, 8, 8>, conv2d<16, 3, 1, 1, no_bias>, batch_norm, relu>;
using max_pool_padded_case = network<input<3, 9, 9>, max_pool2d<3, 2, 1>>;
using resnet_block_case =
    network<input<8, 8, 8>,
            residual_with<layers<conv2d<16, 3, 2, 1, no_bias>, batch_norm, relu, conv2d<16, 3, 1, 1, no_bias>, batch_norm>,
                          shortcut<conv2d<16, 1, 2, 0, no_bias>, batch_norm>>,
            relu, global_avg_pool2d, linear<5>>;

// X(name) for every case above: the instantiation lists of both sides and the test list.
#define LOOM_CUDA_TEST_PASS_CASES(X)                                                                               \
  X(linear_case) X(linear_relu_case) X(linear_relu_unaligned_case) X(conv_case) X(conv_strided_case) X(conv_wide_case) X(conv_relu_case) X(max_pool_case)           \
  X(max_pool_overlap_case) X(avg_pool_case) X(avg_pool_overlap_case) X(flatten_case) X(relu_case)                 \
  X(leaky_relu_case) X(tanh_case) X(sigmoid_case) X(gelu_case) X(dropout_case) X(layer_norm_case)                 \
  X(residual_case) X(mlp_case) X(cnn_case) X(mixed_case) X(batch_norm_case) X(batch_norm_relu_case)                \
  X(max_pool_padded_case) X(resnet_block_case)

/// Networks trained for the backend agreement of whole runs (1 x 12 x 12 images, 10 classes).
using train_mlp = network<input<1, 12, 12>, flatten, linear<64>, relu, dropout_rate<10>, linear<32>, loom::tanh, linear<10>>;
using train_cnn = network<input<1, 12, 12>, conv2d<8, 3, 1, 1>, relu, max_pool2d<2>, conv2d<8, 3, 1, 1>, relu,
                          avg_pool2d<2>, flatten, linear<10>>;
#define LOOM_CUDA_TEST_TRAIN_CASES(X) X(train_mlp) X(train_cnn)

/// Parameters, input and output gradient of one pass (host, plain row-major), and the math
/// mode of its products.
struct pass_input {
  std::vector<float> params, x, dy;
  std::size_t batch = 0;
  math_mode math = math_mode::fp32;
};

/// Output, input gradient and parameter gradients of one pass (host, plain row-major).
struct pass_result {
  std::vector<float> y, dx, dparams;
};

/// One training forward (dropout active) and backward of Network's layer sequence on Backend.
template <class Network, class Backend>
pass_result run_pass(const pass_input& in);

/// What a short training run ended with.
struct train_result {
  std::size_t steps = 0;
  double train_loss = 0;     // mean loss over the last epoch's samples
  double eval_loss = 0;      // after training, over the whole set
  double eval_accuracy = 0;
  std::vector<float> params;
};

/// `steps` SGD steps (momentum 0.9) of Network on Backend over the synthetic set, seed 1, with
/// trainer_options::math = math.
template <class Network, class Backend>
train_result run_training(std::size_t steps, math_mode math = math_mode::fp32);

/// A deterministic labelled image set: 1 x 12 x 12 bytes, 10 classes. A faint 4 x 4 patch
/// whose place says the class (class 9: a slightly brighter image) under noise, and 15% of the
/// labels drawn at random: learnable, but the loss stays well above zero, so that training runs
/// on two backends are compared on a loss that still moves.
struct synthetic_images {
  using sample_shape = shape<1, 12, 12>;
  static constexpr std::size_t classes = 10;
  explicit synthetic_images(std::size_t n) : pixels_(n * sample_shape::size), labels_(n) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t cls = counter_hash(11, 0, i) % classes;
      const bool random_label = counter_hash(13, 0, i) % 100 < 15;
      labels_[i] = static_cast<std::uint8_t>(random_label ? counter_hash(14, 0, i) % classes : cls);
      for (std::size_t j = 0; j < sample_shape::size; ++j) {
        const std::size_t r = j / 12, c = j % 12;
        const bool patch = cls < 9 && r / 4 == cls / 3 && c / 4 == cls % 3;
        const std::size_t noise = counter_hash(12, i, j) % 200;
        pixels_[i * sample_shape::size + j] = static_cast<std::uint8_t>(noise + (patch ? 40 : 0) + (cls == 9 ? 12 : 0));
      }
    }
  }
  std::size_t size() const { return labels_.size(); }
  const std::uint8_t* pixels(std::size_t i) const { return pixels_.data() + i * sample_shape::size; }
  int label(std::size_t i) const { return labels_[i]; }

 private:
  std::vector<std::uint8_t> pixels_, labels_;
};

}  // namespace loom::cuda_tests
