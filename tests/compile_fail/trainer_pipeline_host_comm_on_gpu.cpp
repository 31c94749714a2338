// SPDX-License-Identifier: Apache-2.0
// A pipeline whose stages would exchange activations in GPU memory (loom::cuda) over a
// host-memory communicator: the pipeline trainer says to use loom::nccl_comm (or loom::cpu).
// A stand-in for loom::cuda keeps the case to g++: loom::cpu with memory the host may not touch.
// expect: loom::pipeline_engine: pipeline stages exchange activations in GPU memory, which this communicator cannot move
// expect: use loom::nccl_comm
// max-errors: 1
#include <cstddef>

#include "loom/backend/cpu.hpp"
#include "loom/comm/local.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/loss.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/train/trainer.hpp"

struct device_memory : loom::host_space {
  static constexpr bool host_accessible = false;
  static void copy_to_host(void*, const void*, std::size_t) {}
  static void copy_from_host(void*, const void*, std::size_t) {}
};
struct gpu_like : loom::cpu {
  using memory_space = device_memory;
  static void synchronize() {}
};

using net = loom::network<loom::input<8>, loom::linear<4>, loom::relu, loom::linear<2>>;
using policy = loom::model_parallel<loom::pipeline<2>, loom::local_comm>;
using gpu_trainer = loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy, gpu_like>;
static_assert(sizeof(gpu_trainer) > 0);

int main() {}
