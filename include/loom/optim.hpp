// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything for updating parameters: the SGD, Adam and AdamW optimizers (and
// loom::any_optimizer, one of them chosen at run time), learning-rate schedules and global-norm gradient clipping, all over flat buffers.

#include "loom/optim/adam.hpp"
#include "loom/optim/any.hpp"
#include "loom/optim/clip.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/optim/sgd.hpp"
