// SPDX-License-Identifier: Apache-2.0
#pragma once
// Training runs on loom::cuda that the nccl_comm tests (g++) call through nccl_train.cu (nvcc).

#include <cstddef>
#include <vector>

namespace loom::cuda_tests {

/// The parameters after `steps` SGD steps of train_mlp on the synthetic set (global batch 32),
/// data-parallel over nccl_comm::world() (collective) or alone on this rank's GPU.
std::vector<float> train_mlp_data_parallel(std::size_t steps);
std::vector<float> train_mlp_alone(std::size_t steps);

}  // namespace loom::cuda_tests
