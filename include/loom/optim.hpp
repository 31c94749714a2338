// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything for updating parameters: the SGD, Adam and AdamW optimizers, learning-rate
// schedules and global-norm gradient clipping, all over flat buffers.

#include "loom/optim/adam.hpp"
#include "loom/optim/clip.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/optim/sgd.hpp"
