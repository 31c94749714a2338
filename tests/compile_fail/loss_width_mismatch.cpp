// SPDX-License-Identifier: Apache-2.0
// A network with 5 outputs trained on labels of 10 classes: the loss's width does not match.
// expect: the loss's width \(the network's output size\) does not match the number of classes
// expect: loss_width_does_not_match_classes<loom::shape<5>, 10>
// max-errors: 2
#include <cstdint>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

using net = loom::network<loom::input<1, 28, 28>, loom::flatten, loom::linear<32>, loom::relu, loom::linear<5>>;

int main() {
  loom::data::fashion_mnist_set data(std::vector<std::uint8_t>(784), std::vector<std::uint8_t>(1, 0));
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t;
  t.fit(data, {.epochs = 1, .batch = 1, .progress = nullptr});
}
