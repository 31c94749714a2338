// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything a CPU-only user needs: shapes and tensors, the CPU backend, every layer, networks,
// losses, optimizers, data sets and the trainer. GPU and MPI parts have their own headers.

#include "loom/backend/cpu.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/data.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/dropout.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/layers/residual.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"
#include "loom/optim.hpp"
#include "loom/train/trainer.hpp"
