// SPDX-License-Identifier: Apache-2.0
// A network with batch norm saved from its parameters alone would lose its running statistics.
// expect: this network holds buffers .batch norm's running statistics., which are part of its weights
// max-errors: 1
#include <vector>

#include "loom/io/safetensors.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/linear.hpp"

using net = loom::network<loom::input<8>, loom::linear<4>, loom::batch_norm>;

int main() {
  std::vector<float> w(net::parameter_count);
  loom::save_weights<net, float>(w, "w.safetensors");
}
