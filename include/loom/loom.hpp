// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything a CPU-only user needs to train: shapes and tensors, the CPU backend, every layer,
// networks, losses, optimizers, data sets and the trainer. The weights and ONNX files are in
// loom/io.hpp (about 1.5 s of compile time that only programs writing them should pay); MPI and
// NCCL parts have their own headers.
// Compiled by nvcc with the loom::cuda component, it brings the CUDA backend (loom::cuda)
// instead of the CPU one (nvcc cannot parse oneDNN's header; see backend/default_backend.hpp).

#include "loom/backend/default_backend.hpp"
#if defined(__CUDACC__) && defined(LOOM_HAS_CUDA)
#include "loom/backend/cuda.hpp"
#endif
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/data.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/dropout.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/named.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/layers/tensor_parallel.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/residual_with.hpp"
#include "loom/optim.hpp"
#include "loom/parallel/memory_plan.hpp"
#include "loom/parallel/tensor/plan.hpp"
#include "loom/parallel/world_sizes.hpp"
#include "loom/train/trainer.hpp"
