// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of cases.hpp, written once over the backend. Included after the backend's
// header by cpu_side.cpp and cuda_side.cu, which instantiate them.

#include <cstddef>
#include <cstring>
#include <vector>

#include "cases.hpp"
#include "loom/core/memory.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

namespace loom::cuda_tests {

template <class T, class Space>
void to_space(const std::vector<T>& host, buffer<T, Space>& dst) {
  dst = buffer<T, Space>(host.size());
  if constexpr (Space::host_accessible) {
    if (!host.empty()) std::memcpy(dst.data(), host.data(), host.size() * sizeof(T));
  } else {
    Space::copy_from_host(dst.data(), host.data(), host.size() * sizeof(T));
  }
}

template <class T, class Space>
std::vector<T> from_space(const T* src, std::size_t n) {
  std::vector<T> out(n);
  if constexpr (Space::host_accessible) {
    if (n) std::memcpy(out.data(), src, n * sizeof(T));
  } else {
    Space::copy_to_host(out.data(), src, n * sizeof(T));
  }
  return out;
}

template <class Network, class Backend>
pass_result run_pass(const pass_input& in) {
  using T = float;
  using space = typename Backend::memory_space;
  using out_shape = typename Network::output_shape;
  const std::size_t batch = in.batch;
  typename Network::template sequence_type<T, Backend> seq;
  buffer<T, space> params, x, dy, dx(batch * Network::input_shape::size), dparams(Network::parameter_count);
  // Batch norm's running statistics: initialised on the host, bound where the backend computes.
  std::vector<float> initial_buffers(Network::buffer_count);
  seq.initialize_buffers(initial_buffers.data());
  buffer<T, space> buffers;
  to_space(initial_buffers, buffers);
  seq.bind_buffers(buffers.data());
  to_space(in.params, params);
  to_space(in.x, x);
  to_space(in.dy, dy);
  run_context ctx;
  ctx.seed = 7;
  ctx.step = 3;
  ctx.math = in.math;
  auto y = seq.forward(ctx, params.data(), activation<const T, Backend>{x.data()}, batch);
  // The CPU may answer in a blocked layout: compare plain values, and give backward its
  // gradient in the layout the output has.
  typename Backend::layout_converter conv;
  const T* y_plain = conv.template to_plain<T, out_shape>(y.data, y.format, batch);
  pass_result r;
  r.y = from_space<T, space>(y_plain, batch * out_shape::size);
  buffer<T, space> dy_in_layout(batch * out_shape::size);
  conv.template from_plain<T, out_shape>(dy.data(), y.format, dy_in_layout.data(), batch);
  seq.backward(ctx, params.data(), activation<const T, Backend>{x.data()}, dy_in_layout.data(), dx.data(), dparams.data());
  r.dx = from_space<T, space>(dx.data(), dx.size());
  r.dparams = from_space<T, space>(dparams.data(), Network::parameter_count);
  return r;
}

template <class Network, class Backend>
train_result run_training(std::size_t steps, math_mode math) {
  static const synthetic_images data(1600);
  trainer<Network, softmax_cross_entropy, sgd, single_process, Backend> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                          {.seed = 1, .threads = 2, .math = math}};
  fit_options o;
  o.epochs = 1000;
  o.max_steps = steps;
  o.batch = 32;
  o.progress = nullptr;
  const fit_result f = t.fit(data, o);
  const eval_result e = t.evaluate(data, 400);
  train_result r;
  r.steps = f.steps;
  r.train_loss = f.train_loss;
  r.eval_loss = e.loss;
  r.eval_accuracy = e.accuracy;
  r.params = t.model().copy_parameters_to_host();
  return r;
}

}  // namespace loom::cuda_tests

#define LOOM_CUDA_TEST_INSTANTIATE_PASS(name)                                                                 \
  template loom::cuda_tests::pass_result loom::cuda_tests::run_pass<loom::cuda_tests::name, LOOM_TEST_BACKEND>( \
      const loom::cuda_tests::pass_input&);
#define LOOM_CUDA_TEST_INSTANTIATE_TRAIN(name)                                                              \
  template loom::cuda_tests::train_result                                                                   \
  loom::cuda_tests::run_training<loom::cuda_tests::name, LOOM_TEST_BACKEND>(std::size_t, loom::math_mode);
