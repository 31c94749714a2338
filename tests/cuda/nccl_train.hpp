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

/// The same with Adam (lr 1e-3), data-parallel over nccl_comm::world() with the optimizer state
/// sharded (shard_optimizer_state: reduce-scatter, then allgather) and without. Collective.
std::vector<float> train_mlp_zero(std::size_t steps);
std::vector<float> train_mlp_data_parallel_adam(std::size_t steps);

/// The same on a 2-stage pipeline (model_parallel<pipeline<2, micro_batches<4>>, nccl_comm>,
/// 1F1B, the default) over nccl_comm::world(), which must have 2 ranks: the whole model's parameters,
/// gathered over the stages, on every rank. Collective.
std::vector<float> train_mlp_pipeline(std::size_t steps);

/// The same on 2 replicas of that pipeline (hybrid<data_parallel<nccl_comm>, pipeline<2, ...>>)
/// over nccl_comm::world(), which must have 4 ranks. Collective.
std::vector<float> train_mlp_hybrid_pipeline(std::size_t steps);

/// An mlp with a column_parallel and a row_parallel layer under
/// model_parallel<tensor_parallel<2>, nccl_comm> over nccl_comm::world(), which must have 2
/// ranks (collective), and the same mlp without the split alone: the whole model's parameters
/// (gathered over the slices) after `steps` steps.
std::vector<float> train_tp_mlp_tensor_parallel(std::size_t steps);
std::vector<float> train_plain_mlp_alone(std::size_t steps);

}  // namespace loom::cuda_tests
