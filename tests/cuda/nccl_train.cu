// SPDX-License-Identifier: Apache-2.0
// train_mlp on loom::cuda, data-parallel over nccl_comm and alone: the one change between the
// two trainers is the policy.
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
  return t.model().copy_parameters_to_host();
}
}  // namespace

std::vector<float> train_mlp_data_parallel(std::size_t steps) {
  trainer<train_mlp, softmax_cross_entropy, sgd, data_parallel<nccl_comm>, cuda> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                                   {.seed = 1, .threads = 1}};
  return run(t, steps);
}

std::vector<float> train_mlp_alone(std::size_t steps) {
  trainer<train_mlp, softmax_cross_entropy, sgd, single_process, cuda> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                         {.seed = 1, .threads = 1}};
  return run(t, steps);
}

}  // namespace loom::cuda_tests
