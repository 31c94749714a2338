// SPDX-License-Identifier: Apache-2.0
// Synchronized batch norm (loom::sync_batch_norm), run by CTest under `mpirun -np N` (N = 2, 4;
// the tensor-parallel hybrid on 4):
// - a network with batch norms on images and on a vector, data-parallel with the global batch B
//   split over the ranks, trains as one process training with batch B: after one step (lr 0.05)
//   and after 50 (lr 2.5e-4, momentum 0.9) parameters and running statistics within 1e-5 relative
//   (float sums in another order, and one process's batch norm is oneDNN's, whose float
//   variance differs from loom's double sums by up to 2e-6 after a step with AVX2 kernels; the
//   difference grows with training, about 3x a step at lr 0.05, which is why the long run's
//   steps are small), the running statistics
//   bitwise alike on every rank; without synchronization the 50 steps end more than 10x as far
//   from one process (each replica normalises with its share's statistics);
// - the same under ZeRO (shard_optimizer_state), over loom::hierarchical_comm, chosen at run
//   time (data_parallel_choice::sync_batch_norm: bitwise the named policy's run), and in the
//   tensor-parallel hybrid's data-parallel group (4 ranks: 2 replicas x 2 slices);
// - a short last batch that leaves a rank without samples (it still takes part in the sums);
// - one value per channel over all the replicas together is refused on every rank alike.
// Exit status is non-zero on any rank's failure.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common.hpp"
#include "loom/comm/hierarchical.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"

using namespace loom_test;

namespace {

/// Batch norms on images (after bias-free convolutions of 16 and 32 channels: with 8 and 16 this
/// test ran 10x slower with AVX-512 than with AVX2 kernels) and on a vector; a Megatron pair of
/// linear layers for the tensor-parallel hybrid (plain linear layers elsewhere); smooth activations
/// and average pooling, so that float sums in another order stay small over 50 steps (see
/// common.hpp: a ReLU kink flipped by rounding is amplified by training).
using bn_net = loom::network<loom::input<1, 28, 28>,
                             loom::conv2d<16, 3, 1, 1, loom::no_bias>, loom::batch_norm, loom::tanh, loom::avg_pool2d<2>,
                             loom::conv2d<32, 3, 1, 1, loom::no_bias>, loom::batch_norm, loom::tanh,
                             loom::global_avg_pool2d,
                             loom::column_parallel<loom::linear<64>>, loom::tanh,
                             loom::row_parallel<loom::linear<32>>, loom::batch_norm, loom::tanh,
                             loom::linear<10>>;

using plain_dp = loom::data_parallel<loom::mpi_comm>;
using sync_dp = loom::data_parallel<loom::mpi_comm, loom::sync_batch_norm>;
using sync_zero_dp = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state, loom::sync_batch_norm>;
using sync_hier_dp = loom::data_parallel<loom::hierarchical_comm, loom::sync_batch_norm>;
using run_time_dp = loom::data_parallel<loom::mpi_comm, loom::choose_at_run_time>;
using sync_tensor_hybrid = loom::hybrid<sync_dp, loom::tensor_parallel<2>>;

static_assert(sync_dp::syncs_batch_norm && !plain_dp::syncs_batch_norm && sync_zero_dp::syncs_batch_norm);

// 50 small steps (see the file comment); one large one.
const loom::sgd::options sgd_opts{.lr = 2.5e-4f, .momentum = 0.9f};
const loom::sgd::options large_step{.lr = 0.05f, .momentum = 0.9f};
constexpr std::size_t steps_n = 50, batch = 64;

struct state {
  std::vector<float> params, buffers;
};

template <class Trainer>
state train(Trainer& t, const loom::data::fashion_mnist_set& data, std::size_t n = steps_n) {
  t.fit(data, steps(n, batch));
  return {t.gather_parameters(), t.gather_buffers()};
}

template <class Policy>
state run(const loom::data::fashion_mnist_set& data, std::size_t n = steps_n, loom::sgd::options o = sgd_opts) {
  loom::trainer<bn_net, loom::softmax_cross_entropy, loom::sgd, Policy> t{o, {.seed = 3, .threads = 1}};
  return train(t, data, n);
}

/// One process with the whole batch (every rank computes it, alone).
state alone(const loom::data::fashion_mnist_set& data, std::size_t n = steps_n, loom::sgd::options o = sgd_opts) {
  return run<loom::single_process>(data, n, o);
}

double distance(const state& a, const state& b) {
  return std::max(relative_distance(a.params, b.params), relative_distance(a.buffers, b.buffers));
}

/// This rank's running statistics are bitwise rank 0's.
template <class Trainer>
void buffers_alike(Trainer& t, loom::mpi_comm& comm, const std::string& what) {
  std::vector<float> mine = t.model().copy_buffers_to_host(), first = mine;
  comm.broadcast(first.data(), first.size(), 0);
  check(mine == first, what + ": rank " + std::to_string(comm.rank()) + "'s running statistics differ from rank 0's");
}

void close_to(const state& got, const state& want, double tolerance, const std::string& what) {
  const double dp = relative_distance(got.params, want.params), db = relative_distance(got.buffers, want.buffers);
  check(dp <= tolerance && db <= tolerance, what + ": parameters " + std::to_string(dp) + " and running statistics " +
                                                std::to_string(db) + " from one process (relative; at most " +
                                                std::to_string(tolerance) + ")");
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  const int ranks = comm.size();
  const auto& data = train_set();  // 3,200 images: 50 steps of 64
  const state reference = alone(data);

  // One large step: the arithmetic of synchronized batch norm, before training amplifies
  // float rounding.
  close_to(run<sync_dp>(data, 1, large_step), alone(data, 1, large_step), 1e-5, "one step of sync_batch_norm");

  // Synchronized: one process's run, and running statistics alike on every rank.
  double synced = 0;
  {
    loom::trainer<bn_net, loom::softmax_cross_entropy, loom::sgd, sync_dp> t{sgd_opts, {.seed = 3, .threads = 1}};
    const state s = train(t, data);
    close_to(s, reference, 1e-5, "sync_batch_norm on " + std::to_string(ranks) + " ranks");
    synced = distance(s, reference);
    buffers_alike(t, comm, "sync_batch_norm");

    // Chosen at run time: bitwise the named policy's run.
    loom::trainer<bn_net, loom::softmax_cross_entropy, loom::sgd, run_time_dp> c{
        sgd_opts, {.seed = 3, .threads = 1}, loom::data_parallel_choice{.sync_batch_norm = true}};
    const state r = train(c, data);
    check(r.params == s.params && r.buffers == s.buffers,
          "data_parallel_choice::sync_batch_norm does not end bitwise where the policy naming sync_batch_norm ends");
  }

  // Not synchronized: each replica's statistics are its share's; far from one process. (What
  // the synchronized runs above are measured against: the test can tell the two apart.)
  {
    const double d = distance(run<plain_dp>(data), reference);
    check(d > 10 * synced, "without sync_batch_norm the run ends " + std::to_string(d) +
                               " from one process, not 10x the synchronized run's " + std::to_string(synced) +
                               ": the checks cannot tell the difference");
    if (comm.rank() == 0)
      std::printf("50 steps on %d ranks, relative to one process: synchronized %.3g, not %.3g\n", ranks, synced, d);
  }

  close_to(run<sync_zero_dp>(data), reference, 1e-5, "sync_batch_norm with shard_optimizer_state");

  {
    loom::trainer<bn_net, loom::softmax_cross_entropy, loom::sgd, sync_hier_dp> t{
        loom::hierarchical_comm::world(), sgd_opts, {.seed = 3, .threads = 1}};
    close_to(train(t, data), reference, 1e-5, "sync_batch_norm over hierarchical_comm");
  }

  if (ranks % 2 == 0) {
    loom::trainer<bn_net, loom::softmax_cross_entropy, loom::sgd, sync_tensor_hybrid> t{sgd_opts, {.seed = 3, .threads = 1}};
    close_to(train(t, data), reference, 1e-5, "sync_batch_norm in hybrid<data_parallel, tensor_parallel<2>>");
  }

  // A short last batch: 3,200 + 3 images, the last batch of 3 leaves a rank of 4 without
  // samples (on 2 ranks: 2 and 1). 51 steps, against one process on the same images.
  {
    const auto longer = loom::data::fashion_mnist(loom::data::split::train).first(3203);
    close_to(run<sync_dp>(longer, steps_n + 1), alone(longer, steps_n + 1), 1e-5,
             "sync_batch_norm with a short last batch (3 images over " + std::to_string(ranks) + " ranks)");
  }

  // One value per channel over all the replicas (a last batch of 1 image, the vector batch
  // norm): every rank refuses alike, with the sentence.
  {
    const auto one_over = loom::data::fashion_mnist(loom::data::split::train).first(3201);
    std::string message;
    try {
      run<sync_dp>(one_over, steps_n + 1);
    } catch (const loom::invalid_argument& e) {
      message = e.what();
    }
    check(message.find("expected more than 1 value per channel when training, got 1 over the " + std::to_string(ranks) +
                       " replicas") != std::string::npos,
          "a last batch of 1 image under sync_batch_norm: expected the one-value refusal, got '" + message + "'");
  }

  return finish(comm);
}
