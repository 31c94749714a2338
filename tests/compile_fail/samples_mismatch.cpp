// SPDX-License-Identifier: Apache-2.0
// A network for 32 x 32 RGB images trained on 28 x 28 grey-scale samples.
// expect: loom::trainer: the data set's samples do not have the network's input size
// expect: network_input_does_not_match_samples<loom::shape<3, 32, 32>, loom::shape<1, 28, 28>
// max-errors: 2
#include <cstdint>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

using net = loom::network<loom::input<3, 32, 32>, loom::flatten, loom::linear<10>>;

int main() {
  loom::data::fashion_mnist_set data(std::vector<std::uint8_t>(784), std::vector<std::uint8_t>(1, 0));
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t;
  t.fit(data, {.epochs = 1, .batch = 1, .progress = nullptr});
}
