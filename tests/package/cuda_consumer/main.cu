// SPDX-License-Identifier: Apache-2.0
// A tiny training run through an installed loom on the GPU: the package consumer's small CNN on
// loom::cuda takes a few SGD steps on one fixed batch, and its loss must go down. Without a
// GPU it has been built and linked (the point of the test) and says that it did not train.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "loom/comm/nccl.hpp"
#include "loom/loom.hpp"

using net = loom::network<loom::input<1, 8, 8>, loom::conv2d<4, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::flatten, loom::linear<3>>;
static_assert(loom::communicator<loom::nccl_comm>);

int main() {
  if (loom::cuda_device_count() == 0) {
    std::printf("loom consumer: %zu parameters, loss not computed: no CUDA device (built and linked with loom::cuda)\n",
                net::parameter_count);
    return 0;
  }
  constexpr std::size_t batch = 6, classes = 3;
  std::vector<float> x(batch * net::input_shape::size);
  std::vector<std::int32_t> labels(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    labels[i] = static_cast<std::int32_t>(i % classes);
    for (std::size_t j = 0; j < net::input_shape::size; ++j)
      x[i * net::input_shape::size + j] = static_cast<float>((j * (i + 1)) % 7) / 7.0f - 0.4f;
  }
  using model = loom::model<net, float, loom::cuda>;
  model m(1);
  loom::buffer<float, loom::cuda_space> dx(x.size()), dy(batch * classes);
  loom::buffer<std::int32_t, loom::cuda_space> dl(batch);
  model::copy_from_host(x.data(), x.size(), dx.data());
  loom::cuda::copy(dl.data(), labels.data(), batch);
  loom::sgd::state<float, loom::cuda> opt({.lr = 0.1f}, net::parameter_count);
  loom::loss_workspace<loom::cuda> ws;
  loom::run_context ctx;
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    const float* y = m.forward(ctx, dx.data(), batch);
    const auto v = loom::softmax_cross_entropy::compute<loom::cuda, classes>(y, dl.data(), dy.data(), batch,
                                                                              1.0f / batch, ws);
    m.backward(ctx, dy.data(), batch);
    opt.step(m.parameters().data(), m.gradients().data(), net::parameter_count, 0.1f);
    (step == 0 ? first : last) = v.sum / batch;
  }
  std::printf("loom consumer: %zu parameters, loss %.4f -> %.4f after 5 SGD steps on the GPU\n", net::parameter_count,
              first, last);
  return last < first ? 0 : 1;
}
