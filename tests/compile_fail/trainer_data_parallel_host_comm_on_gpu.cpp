// SPDX-License-Identifier: Apache-2.0
// data_parallel over a communicator that moves host memory only (local_comm here; mpi_comm
// alike) with a backend whose memory the host cannot reach (loom::cuda): the trainer says to
// use nccl_comm. A stand-in for loom::cuda keeps the case to g++: loom::cpu with memory the
// host may not touch.
// expect: this data_parallel communicator cannot move GPU memory
// expect: nccl_comm
// max-errors: 1
#include <cstddef>

#include "loom/backend/cpu.hpp"
#include "loom/comm/local.hpp"
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

using net = loom::network<loom::input<8>, loom::linear<4>>;
using gpu_trainer = loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>, gpu_like>;
static_assert(sizeof(gpu_trainer) > 0);

int main() {}
