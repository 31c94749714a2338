// SPDX-License-Identifier: Apache-2.0
// Deterministic (split-invariant) data parallelism over loom::mpi_comm, run by CTest under
// `mpirun -np N` (N = 2, 3, 4, 5, 6): the exchange of made-up chunk gradients gives every rank
// the bits of one rank's tree, full batches and tails; with fit_options::deterministic_chunk,
// N processes with global batch B end bitwise where one process with batch B does — the mlp
// and the example's ReLU/max-pool cnn over 50 steps, and tail batches that leave ranks without
// samples — and a chunk that leaves ranks idle is refused on every rank. B is 64 (4 chunks of
// 16) up to 4 ranks, 112 (7 chunks) on more. Exit status is non-zero on any rank's failure.

#include <cstdio>
#include <string>

#include "common.hpp"
#include "exchange_check.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"

using namespace loom_test;
using mpi_dp = loom::data_parallel<loom::mpi_comm>;

namespace {

const loom::sgd::options momentum{.lr = 0.02f, .momentum = 0.9f};

loom::fit_options chunked(std::size_t n, std::size_t batch, std::size_t chunk) {
  auto o = steps(n, batch);
  o.deterministic_chunk = chunk;
  return o;
}

/// Trains Net on all ranks, then compares with one process trained on rank 0 (the others wait
/// for its parameters): every replica and the reference must be bitwise equal.
template <class Net, class Dataset>
void equivalence(const char* name, const Dataset& data, const loom::fit_options& o) {
  auto comm = loom::mpi_comm::world();
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, mpi_dp> t{momentum, {.seed = 1, .threads = 1}};
  t.fit(data, o);
  auto p = t.model().parameters();
  const std::vector<float> mine(p.begin(), p.end());
  std::vector<float> ref(mine.size());
  if (comm.rank() == 0) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> alone{momentum, {.seed = 1, .threads = 1}};
    alone.fit(data, o);
    auto q = alone.model().parameters();
    ref.assign(q.begin(), q.end());
  }
  comm.broadcast(ref.data(), ref.size(), 0);
  const double d = relative_distance(mine, ref);
  check(d <= 1e-5, std::string(name) + ": relative distance to one process " + std::to_string(d) + " > 1e-5");
  check(mine == ref, std::string(name) + ": not bitwise equal to one process (relative distance " + std::to_string(d) + ")");
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, %zu steps of %zu in chunks of %zu: relative distance to 1 process %.3g%s\n", name,
                comm.size(), o.max_steps, o.batch, o.deterministic_chunk, d, mine == ref ? " (bitwise equal)" : "");
}

/// The exchange alone, of chunk gradients made up alike on every rank: each rank's root must
/// be bitwise one rank's tree over all chunks, for full batches and tails of 1 to K - 1 chunks.
void exchange_against_one_rank(std::size_t batch) {
  auto comm = loom::mpi_comm::world();
  const auto plan = loom::chunk_plan::make(batch, 16, static_cast<std::size_t>(comm.size()));
  loom::gradient_tree<float, loom::cpu> mine;
  loom::chunk_exchange<float, loom::cpu> ex;
  const std::size_t n = 100003;  // not a multiple of any world size
  for (std::size_t global_n = batch; global_n >= 1; global_n = global_n > 16 ? global_n - 16 : 0) {
    const std::size_t k = plan.chunks_in(global_n);
    const auto ref = one_rank_root(k, n);
    if (k >= 4) check(ref != running_sum(k, n), "the made-up gradients do not tell the tree from a running sum");
    const auto got = exchanged(comm, plan, global_n, n, mine, ex);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) differ += got[i] != ref[i];
    check(differ == 0, "exchange of " + std::to_string(k) + " chunks (a global batch of " + std::to_string(global_n) +
                           "): " + std::to_string(differ) + " of " + std::to_string(n) +
                           " values differ from one rank's tree");
  }
  if (comm.rank() == 0)
    std::printf("exchange: %d ranks, batches of 1 to %zu chunks: bitwise one rank's tree\n", comm.size(),
                plan.chunks_per_batch);
}

void idle_ranks_refused() {
  auto comm = loom::mpi_comm::world();
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, mpi_dp> t{momentum, {.seed = 1, .threads = 1}};
  std::string message = "(no error)";
  try {
    t.fit(train_set(), chunked(2, 64, 64));
  } catch (const loom::invalid_argument& e) {
    message = e.what();
  }
  const std::string want = "deterministic_chunk=64 with batch=64 on " + std::to_string(comm.size()) +
                           " ranks: a full batch makes 1 chunk of at most 64 samples, which leaves " +
                           std::to_string(comm.size() - 1) + " rank";
  check(message.find(want) != std::string::npos, "chunk of a whole batch: expected an error containing '" + want +
                                                     "', got: " + message);
  check(t.steps() == 0, "the refused fit took steps");
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  try {
    const std::size_t batch = comm.size() <= 4 ? 64 : 112;
    exchange_against_one_rank(batch);
    equivalence<mlp>("mlp", train_set(), chunked(50, batch, 16));
    equivalence<cnn>("the example's cnn", train_set(), chunked(50, batch, 16));
    // 656 = 10 x 64 + 16: each epoch ends with one chunk, rank 0's; 24 steps cross two epochs.
    const auto all = loom::data::fashion_mnist(loom::data::split::train);
    const auto tail = all.first(10 * batch + 16);
    equivalence<mlp>("mlp, a tail batch of one chunk", tail, chunked(24, batch, 16));
    // 10 B + 40: each epoch ends with chunks of 16, 16 and 8, the last ranks without samples.
    const auto tail3 = all.first(10 * batch + 40);
    equivalence<mlp>("mlp, a tail batch of three chunks", tail3, chunked(24, batch, 16));
    idle_ranks_refused();
  } catch (const loom::error& e) {
    check(false, e.what());
  }
  return finish(comm);
}
