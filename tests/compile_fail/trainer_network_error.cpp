// SPDX-License-Identifier: Apache-2.0
// A wrong network handed to the trainer (linear straight after the image, no flatten): the
// layer's message, and not a second one from the trainer about the loss's width.
// expect: loom::linear needs a 1-D input
// expect: linear_at_layer_needs_a_1d_input_but_got<0, loom::shape<1, 28, 28>
// max-errors: 2
#include <cstdint>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

using net = loom::network<loom::input<1, 28, 28>, loom::linear<32>, loom::relu, loom::linear<10>>;

int main() {
  loom::data::fashion_mnist_set data(std::vector<std::uint8_t>(784), std::vector<std::uint8_t>(1, 0));
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t;
  t.fit(data, {.epochs = 1, .batch = 1, .progress = nullptr});
}
