// SPDX-License-Identifier: Apache-2.0
#pragma once
// The networks the io tests write, read and export: each layer kind alone, the example's mlp and
// cnn, and a network with residuals and layer_norm. check_onnx.py and check_torch.py build the
// same networks in PyTorch by the same case names.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/loom.hpp"

namespace io_cases {

using linear = loom::network<loom::input<20>, loom::linear<7>>;
using conv2d = loom::network<loom::input<3, 9, 9>, loom::conv2d<4, 3, 2, 1>>;
using relu = loom::network<loom::input<3, 5, 5>, loom::relu>;
using leaky_relu = loom::network<loom::input<24>, loom::leaky_relu>;
using tanh = loom::network<loom::input<24>, loom::tanh>;
using sigmoid = loom::network<loom::input<24>, loom::sigmoid>;
using gelu = loom::network<loom::input<2, 3, 4>, loom::gelu>;
using max_pool2d = loom::network<loom::input<3, 9, 9>, loom::max_pool2d<3, 2>>;
using avg_pool2d = loom::network<loom::input<3, 8, 8>, loom::avg_pool2d<2>>;
using flatten = loom::network<loom::input<2, 3, 4>, loom::flatten>;
using layer_norm = loom::network<loom::input<3, 4, 5>, loom::layer_norm>;
using dropout = loom::network<loom::input<10>, loom::dropout>;
using residual = loom::network<loom::input<16>, loom::residual<loom::linear<16>, loom::tanh>>;
using mlp = example::mlp;
using cnn = example::cnn;
/// Residuals (around a conv block and an MLP block, with dropout inside) and layer_norm both over
/// (C, H, W) and over features.
using res_ln = loom::network<loom::input<1, 12, 12>,
                             loom::conv2d<4, 3, 1, 1>,
                             loom::residual<loom::layer_norm, loom::conv2d<4, 3, 1, 1>, loom::gelu>,
                             loom::max_pool2d<2>, loom::flatten,
                             loom::linear<32>, loom::layer_norm,
                             loom::residual<loom::linear<32>, loom::relu, loom::dropout, loom::linear<32>>,
                             loom::leaky_relu, loom::sigmoid, loom::linear<10>>;

/// Calls f.template operator()<Network>("name") for every case.
template <class F>
void each_case(F&& f) {
  f.template operator()<linear>("linear");
  f.template operator()<conv2d>("conv2d");
  f.template operator()<relu>("relu");
  f.template operator()<leaky_relu>("leaky_relu");
  f.template operator()<tanh>("tanh");
  f.template operator()<sigmoid>("sigmoid");
  f.template operator()<gelu>("gelu");
  f.template operator()<max_pool2d>("max_pool2d");
  f.template operator()<avg_pool2d>("avg_pool2d");
  f.template operator()<flatten>("flatten");
  f.template operator()<layer_norm>("layer_norm");
  f.template operator()<dropout>("dropout");
  f.template operator()<residual>("residual");
  f.template operator()<mlp>("mlp");
  f.template operator()<cnn>("cnn");
  f.template operator()<res_ln>("res_ln");
}

/// Network's parameters from seed, each moved by 0.1 N(0, 1) so that no bias is zero and no
/// layer_norm gain is one (a swapped or misnamed tensor then changes the output).
template <class Network>
std::vector<float> parameters(std::uint64_t seed) {
  loom::model<Network> m(seed);
  std::vector<float> p = m.copy_parameters_to_host();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += static_cast<float>(0.1 * loom::normal_at(seed, 77, i));
  return p;
}

/// batch samples of Network's input, N(0, 1).
template <class Network>
std::vector<float> inputs(std::size_t batch, std::uint64_t seed) {
  std::vector<float> x(batch * Network::input_shape::size);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(loom::normal_at(seed, 99, i));
  return x;
}

/// loom's forward (evaluation mode) of Network with parameters p on batch samples x.
template <class Network>
std::vector<float> forward(const std::vector<float>& p, const std::vector<float>& x, std::size_t batch) {
  loom::model<Network> m(1);
  m.copy_parameters_from_host(p);
  loom::run_context ctx;
  ctx.training = false;
  const float* y = m.forward(ctx, x.data(), batch);
  return {y, y + batch * Network::output_shape::size};
}

}  // namespace io_cases
