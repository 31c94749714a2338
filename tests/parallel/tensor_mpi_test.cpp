// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism over loom::mpi_comm, run by CTest under `mpirun -np N` (real processes).
// N = 2: model_parallel<tensor_parallel<2>>; N = 4: hybrid<data_parallel, tensor_parallel<2>>
// (2 replicas x 2 slices) and model_parallel<tensor_parallel<4>>. Each checks that the gathered
// step-0 parameters are the single-process ones bit for bit, and that after 20 steps of global
// batch 64 the gathered parameters are within 1e-5 (relative L2) of one process's and the same
// on every rank. Exit status is non-zero on any rank's failure.

#include <cmath>
#include <cstdio>
#include <string>

#include "common.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"
#include "loom/parallel/hybrid.hpp"

using namespace loom_test;

namespace {

using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu, loom::linear<10>>;


template <class Policy>
void equivalence(const char* name) {
  auto comm = loom::mpi_comm::world();
  loom::trainer<tp_mlp, loom::softmax_cross_entropy, loom::sgd, Policy> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                          {.seed = 1, .threads = 1}};
  const auto start = t.gather_parameters();
  check(start == loom::model<mlp, float>(1).copy_parameters_to_host(),
        std::string(name) + ": the gathered step-0 parameters differ from one process's");
  const auto r = t.fit(train_set(), steps(20, 64));
  const auto mine = t.gather_parameters();
  std::vector<float> root = mine;
  comm.broadcast(root.data(), root.size(), 0);
  check(root == mine, std::string(name) + ": the gathered parameters differ from rank 0's");
  check(r.ranks == comm.size() && r.figures.size() == static_cast<std::size_t>(comm.size()),
        std::string(name) + ": figures of every rank");
  check(r.samples == 20 * 64, std::string(name) + ": samples counted " + std::to_string(r.samples) + ", not 1280");
  const auto ref = reference<mlp>(20, 64);
  const double d = relative_distance(mine, ref);
  check(d <= 1e-5, std::string(name) + ": relative distance to single-process training " + std::to_string(d) + " > 1e-5");
  double ref_l2 = 0;
  for (float x : ref) ref_l2 += double(x) * x;
  ref_l2 = std::sqrt(ref_l2);
  const double l2 = t.parameters_l2();
  check(std::abs(l2 - ref_l2) <= 1e-5 * ref_l2, std::string(name) + ": parameters_l2 " + std::to_string(l2) +
                                                    " where one process has " + std::to_string(ref_l2));
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, 20 steps of 64: relative distance to 1 process %.3g, %.3f s, tensor comm %.4f s on rank 0\n",
                name, comm.size(), d, r.seconds, r.figures[0].comm_s);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  try {
    if (comm.size() == 2) {
      equivalence<loom::model_parallel<loom::tensor_parallel<2>, loom::mpi_comm>>("tensor_parallel<2>");
    } else if (comm.size() == 4) {
      equivalence<loom::hybrid<loom::data_parallel<loom::mpi_comm>, loom::tensor_parallel<2>>>("hybrid 2 x tensor_parallel<2>");
      equivalence<loom::model_parallel<loom::tensor_parallel<4>, loom::mpi_comm>>("tensor_parallel<4>");
    } else {
      check(false, "run with 2 or 4 ranks, not " + std::to_string(comm.size()));
    }
  } catch (const loom::error& e) {
    check(false, e.what());
  }
  return finish(comm);
}
