// SPDX-License-Identifier: Apache-2.0
// A tiny training run through an installed loom: a small CNN (oneDNN convolution and pooling,
// GEMM for the linear layer, OpenMP threads) takes a few SGD steps on one fixed batch, and its
// loss must go down. Reading a missing IDX file links zlib, as a data set loader would.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "loom/data/idx.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/sgd.hpp"

using net = loom::network<loom::input<1, 8, 8>, loom::conv2d<4, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::flatten, loom::linear<3>>;

int main() {
  loom::set_threads(2);
  constexpr std::size_t batch = 6;
  constexpr std::size_t classes = net::output_shape::size;
  static_assert(classes == 3 && net::parameter_count == (4 * 9 + 4) + (4 * 4 * 4 * 3 + 3));

  std::vector<float> x(batch * net::input_shape::size);
  std::vector<std::int32_t> labels(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    labels[i] = static_cast<std::int32_t>(i % classes);
    for (std::size_t j = 0; j < net::input_shape::size; ++j)
      x[i * net::input_shape::size + j] = static_cast<float>((j * (i + 1)) % 7) / 7.0f - 0.4f;
  }

  loom::model<net, float> m(/*seed=*/1);
  loom::sgd::state<float, loom::cpu> opt({.lr = 0.1f}, net::parameter_count);
  loom::loss_workspace<loom::cpu> ws;
  std::vector<float> dy(batch * classes);
  loom::run_context ctx;
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    ctx.step = static_cast<std::uint64_t>(step);
    const float* y = m.forward(ctx, x.data(), batch);
    const loom::loss_value v = loom::softmax_cross_entropy::compute<loom::cpu, classes>(
        y, labels.data(), dy.data(), batch, 1.0f / batch, ws);
    m.backward(ctx, dy.data(), batch);
    opt.step(m.parameters().data(), m.gradients().data(), net::parameter_count, 0.1f);
    (step == 0 ? first : last) = v.sum / batch;
  }

  bool idx_error = false;
  try {
    loom::data::read_idx("no-such-file.idx", 1);
  } catch (const std::exception&) {
    idx_error = true;
  }

  std::printf("loom consumer: %zu parameters, loss %.4f -> %.4f after 5 SGD steps%s\n", net::parameter_count, first,
              last, idx_error ? "" : " (reading a missing IDX file did not fail!)");
  return (last < first && idx_error) ? 0 : 1;
}
