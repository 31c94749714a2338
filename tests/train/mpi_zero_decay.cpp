// SPDX-License-Identifier: Apache-2.0
// decay_norm_and_bias = false under ZeRO (loom::shard_optimizer_state) over loom::mpi_comm, run
// by CTest under `mpirun -np N` (N = 2, 3): each rank's optimizer state holds slices of buckets
// that cut across layers (and, with small buckets, across tensors), so the norm parameters and
// biases exempt from weight decay are intersected with each rank's slices. One step with weight
// decay leaves them exactly as a step without weight decay, and every other value exactly as a
// step with it (two reference runs), for SGD with momentum and AdamW, with the default buckets
// and with 4 KiB buckets. Exit status is non-zero on any rank's failure.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "../parallel/mpi_check.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/loom.hpp"

using namespace loom_test;

namespace {

using cnn = loom::network<loom::input<1, 28, 28>, loom::conv2d<4, 3, 2, 1>, loom::batch_norm, loom::relu, loom::flatten,
                          loom::linear<16>, loom::layer_norm, loom::relu, loom::linear<10>>;
using zero = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>;
using zero_small = loom::data_parallel<loom::mpi_comm, loom::bucket_bytes<4096>, loom::shard_optimizer_state>;

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(256);
  return s;
}

loom::fit_options steps(std::size_t n) {
  loom::fit_options o;
  o.max_steps = n;
  o.batch = 64;
  o.progress = nullptr;
  return o;
}

/// The file trained_weights writes: named by rank 0's process id (sent to every rank), so that
/// runs side by side do not share it; rank 0 removes it at the end.
std::filesystem::path start_file(loom::mpi_comm& comm) {
  unsigned long long id = comm.rank() == 0 ? static_cast<unsigned long long>(::getpid()) : 0;
  comm.broadcast(&id, 1, 0);
  return std::filesystem::temp_directory_path() / ("loom_mpi_zero_decay_start_" + std::to_string(id) + ".safetensors");
}

/// Weights in which no bias is 0 and no norm weight 1 (decay would not move a zero bias): two
/// plain steps in one process on rank 0, which every rank then reads.
std::filesystem::path trained_weights(loom::mpi_comm& comm) {
  const auto p = start_file(comm);
  if (comm.rank() == 0) {
    loom::trainer<cnn, loom::softmax_cross_entropy, loom::sgd, loom::single_process> t{{.lr = 0.5f},
                                                                                       {.seed = 4, .threads = 1}};
    t.fit(data(), steps(2));
    t.save_weights(p);
  }
  comm.barrier();
  return p;
}

template <class Optimizer, class Policy>
std::vector<float> after_one_step(const typename Optimizer::options& opt, const std::filesystem::path& start) {
  loom::trainer<cnn, loom::softmax_cross_entropy, Optimizer, Policy> t{opt, {.seed = 5, .threads = 1}};
  t.load_weights(start);
  t.fit(data(), steps(1));
  return t.gather_parameters();
}

template <class Optimizer, class Policy>
void check_one_step(const std::string& what, typename Optimizer::options opt, loom::mpi_comm& comm) {
  auto plain = opt;
  plain.weight_decay = 0;
  auto skipping = opt;
  skipping.decay_norm_and_bias = false;
  const auto start = trained_weights(comm);
  const auto decayed = after_one_step<Optimizer, Policy>(opt, start);
  const auto undecayed = after_one_step<Optimizer, Policy>(plain, start);
  const auto got = after_one_step<Optimizer, Policy>(skipping, start);
  if (comm.rank() != 0) return;
  std::vector<bool> mask(cnn::parameter_count, false);
  for (const auto& r : loom::detail::decay_exempt_of_network<cnn>())
    for (std::size_t i = r.begin; i < r.end; ++i) mask[i] = true;
  std::size_t wrong_exempt = 0, wrong_decayed = 0, differs = 0, exempt_differs = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (mask[i]) wrong_exempt += got[i] != undecayed[i], exempt_differs += decayed[i] != undecayed[i];
    else wrong_decayed += got[i] != decayed[i], differs += decayed[i] != undecayed[i];
  }
  // Most exempt values would have moved with decay (not all: where weight_decay * p is below
  // half an ulp of the gradient, float's sum is the gradient alone).
  check(2 * exempt_differs >= static_cast<std::size_t>(std::count(mask.begin(), mask.end(), true)),
        what + ": most exempt values would have moved with decay");
  check(got.size() == cnn::parameter_count, what + ": the whole model gathered");
  check(differs > 0, what + ": weight decay shows on the decayed values");
  check(wrong_exempt == 0, what + ": " + std::to_string(wrong_exempt) + " norm/bias values differ from the run without decay");
  check(wrong_decayed == 0, what + ": " + std::to_string(wrong_decayed) + " other values differ from the run with decay");
  std::printf("%s on %d ranks: %zu exempt values as without decay, the others as with it\n", what.c_str(), comm.size(),
              static_cast<std::size_t>(std::count(mask.begin(), mask.end(), true)));
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  try {
    const loom::sgd::options sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.05f};
    const loom::adamw::options adamw{.lr = 0.01f, .weight_decay = 0.05f};
    check_one_step<loom::sgd, zero>("ZeRO, SGD with momentum", sgd, comm);
    check_one_step<loom::adamw, zero>("ZeRO, AdamW", adamw, comm);
    check_one_step<loom::sgd, zero_small>("ZeRO with 4 KiB buckets, SGD with momentum", sgd, comm);
    check_one_step<loom::adamw, zero_small>("ZeRO with 4 KiB buckets, AdamW", adamw, comm);
    const auto file = start_file(comm);
    comm.barrier();  // every rank has read it
    if (comm.rank() == 0) std::filesystem::remove(file);
  } catch (const std::exception& e) {
    check(false, std::string("threw: ") + e.what());
  }
  return finish(comm);
}
