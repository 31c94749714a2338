// SPDX-License-Identifier: Apache-2.0
// train_mlp on loom::cuda, data-parallel over nccl_comm (also with ZeRO stage 1), on a 2-stage pipeline over nccl_comm
// (alone and in 2 replicas), and alone; a tensor-parallel mlp over nccl_comm and alone: the one
// change between the trainers is the policy.
#include "loom/backend/cuda.hpp"
#include "loom/comm/nccl.hpp"
#include "loom/loom.hpp"

#include "cases.hpp"
#include "nccl_train.hpp"

namespace loom::cuda_tests {

namespace {
template <class Trainer>
std::vector<float> run(Trainer& t, std::size_t steps) {
  static const synthetic_images data(640);
  fit_options o;
  o.epochs = 1000;
  o.max_steps = steps;
  o.batch = 32;
  o.progress = nullptr;
  t.fit(data, o);
  return t.gather_parameters();
}

constexpr sgd::options sgd_options{.lr = 0.02f, .momentum = 0.9f};
constexpr trainer_options options{.seed = 1, .threads = 1};

// An mlp with a column- and a row-parallel layer, and the same network without the split.
using tp_mlp = network<input<1, 12, 12>, flatten, column_parallel<linear<64>>, relu, row_parallel<linear<32>>, loom::tanh,
                       linear<10>>;
using plain_mlp = network<input<1, 12, 12>, flatten, linear<64>, relu, linear<32>, loom::tanh, linear<10>>;
}  // namespace

std::vector<float> train_mlp_data_parallel(std::size_t steps) {
  trainer<train_mlp, softmax_cross_entropy, sgd, data_parallel<nccl_comm>, cuda> t{sgd_options, options};
  return run(t, steps);
}

std::vector<float> train_mlp_zero(std::size_t steps) {
  trainer<train_mlp, softmax_cross_entropy, adam, data_parallel<nccl_comm, shard_optimizer_state>, cuda> t{{.lr = 1e-3f},
                                                                                                           options};
  return run(t, steps);
}

std::vector<float> train_mlp_data_parallel_adam(std::size_t steps) {
  trainer<train_mlp, softmax_cross_entropy, adam, data_parallel<nccl_comm>, cuda> t{{.lr = 1e-3f}, options};
  return run(t, steps);
}

std::vector<float> train_mlp_pipeline(std::size_t steps) {
  using policy = model_parallel<pipeline<2, micro_batches<4>>, nccl_comm>;
  trainer<train_mlp, softmax_cross_entropy, sgd, policy, cuda> t{sgd_options, options};
  return run(t, steps);
}

std::vector<float> train_mlp_hybrid_pipeline(std::size_t steps) {
  using policy = hybrid<data_parallel<nccl_comm>, pipeline<2, micro_batches<4>>>;
  trainer<train_mlp, softmax_cross_entropy, sgd, policy, cuda> t{sgd_options, options};
  return run(t, steps);
}

std::vector<float> train_tp_mlp_tensor_parallel(std::size_t steps) {
  trainer<tp_mlp, softmax_cross_entropy, sgd, model_parallel<tensor_parallel<2>, nccl_comm>, cuda> t{sgd_options, options};
  return run(t, steps);
}

std::vector<float> train_plain_mlp_alone(std::size_t steps) {
  trainer<plain_mlp, softmax_cross_entropy, sgd, single_process, cuda> t{sgd_options, options};
  return run(t, steps);
}

std::vector<float> train_mlp_alone(std::size_t steps) {
  trainer<train_mlp, softmax_cross_entropy, sgd, single_process, cuda> t{sgd_options, options};
  return run(t, steps);
}

}  // namespace loom::cuda_tests
