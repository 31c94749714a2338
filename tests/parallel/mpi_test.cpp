// SPDX-License-Identifier: Apache-2.0
// data_parallel over loom::mpi_comm, run by CTest under `mpirun -np N` (real processes): N
// ranks with global batch B end where one process with batch B does, every replica is
// identical, and the per-rank figures reach every rank. Exit status is non-zero on any rank's
// failure.

#include <cstdio>
#include <string>

#include "common.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"

using namespace loom_test;
using mpi_dp = loom::data_parallel<loom::mpi_comm>;

namespace {

template <class Net>
void equivalence(const char* name, std::size_t n, std::size_t batch) {
  auto comm = loom::mpi_comm::world();
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, mpi_dp> t{{.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = 1}};
  const auto r = t.fit(train_set(), steps(n, batch));
  auto p = t.model().parameters();
  const std::vector<float> mine(p.begin(), p.end());
  // Every replica identical: compare each rank's parameters with rank 0's.
  std::vector<float> root = mine;
  comm.broadcast(root.data(), root.size(), 0);
  check(root == mine, std::string(name) + ": replica differs from rank 0's");
  check(r.figures.size() == static_cast<std::size_t>(comm.size()), std::string(name) + ": figures of every rank");
  // One process with the same global batch (each rank computes it; it is cheap).
  const double d = relative_distance(mine, reference<Net>(n, batch));
  check(d <= 1e-5, std::string(name) + ": relative distance to single-process training " + std::to_string(d) + " > 1e-5");
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, %zu steps of %zu: relative distance to 1 process %.3g, comm exposed %.4f s\n", name,
                comm.size(), n, batch, d, r.figures[0].comm_exposed_s);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  try {
    equivalence<mlp>("mlp", 50, 64);
    equivalence<smooth_cnn>("cnn with tanh and average pooling", 50, 64);
    equivalence<cnn>("the example's cnn", 20, 64);  // why 20: see common.hpp
    equivalence<smooth_mlp>("mlp with tanh, uneven shares and an epoch boundary", 70, 50);
  } catch (const loom::error& e) {
    check(false, e.what());
  }
  return finish(comm);
}
