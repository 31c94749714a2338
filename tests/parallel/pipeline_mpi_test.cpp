// SPDX-License-Identifier: Apache-2.0
// The pipeline trainer over loom::mpi_comm, run by CTest under `mpirun -np N` (real processes):
// on 2 ranks, 2-stage pipelines of the mlp and the example's cnn; on 4 ranks, 4-stage
// pipelines of the mlp and two replicas of a 2-stage pipeline (hybrid 2 x 2). Each run's
// gathered parameters must equal single-process training on the same global batch within 1e-5
// relative L2 after 20 steps, and every rank must report the same loss. Rank 0 prints each
// run's stage figures, and "all pipeline checks passed" at the end when every rank passed.

#include <cmath>
#include <cstdio>
#include <string>

#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"
#include "pipeline_common.hpp"

using namespace loom_test;

namespace {

template <class Net, class Policy>
void equivalence(const char* name, std::size_t n, std::size_t batch) {
  auto comm = loom::mpi_comm::world();
  const auto opts = steps(n, batch);
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{pipeline_sgd, {.seed = 1, .threads = 1}};
  const auto r = t.fit(train_set(), opts);
  const std::vector<float> mine = t.gather_parameters();
  // Every rank gathered the same model: compare with rank 0's.
  std::vector<float> root = mine;
  comm.broadcast(root.data(), root.size(), 0);
  check(root == mine, std::string(name) + ": gathered parameters differ from rank 0's");
  double loss = r.train_loss;
  comm.broadcast(&loss, 1, 0);
  check(loss == r.train_loss, std::string(name) + ": train loss differs from rank 0's");
  check(r.figures.size() == static_cast<std::size_t>(comm.size()), std::string(name) + ": figures of every rank");
  loom::fit_result ref_result;
  const double d = relative_distance(mine, reference_with<Net>(train_set(), opts, &ref_result));
  check(d <= 1e-5, std::string(name) + ": relative distance to single-process training " + std::to_string(d) + " > 1e-5");
  check(std::abs(r.train_loss - ref_result.train_loss) <= 1e-5 * std::abs(ref_result.train_loss),
        std::string(name) + ": train loss " + std::to_string(r.train_loss) + ", single process " +
            std::to_string(ref_result.train_loss));
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, %zu steps of %zu: relative distance to 1 process %.3g, loss %.6f\n%s", name, comm.size(), n,
                batch, d, r.train_loss, loom::stage_figures_table(r.figures).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  using mpi_dp = loom::data_parallel<loom::mpi_comm>;
  try {
    if (comm.size() == 2) {
      equivalence<mlp, loom::model_parallel<loom::pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>, loom::mpi_comm>>(
          "mlp, 2 stages, 4 micro-batches, 1F1B", 20, 64);
      equivalence<mlp, loom::model_parallel<loom::pipeline<2, loom::micro_batches<1>, loom::gpipe>, loom::mpi_comm>>(
          "mlp, 2 stages, 1 micro-batch, GPipe", 20, 64);
      equivalence<cnn, loom::model_parallel<loom::pipeline<2, loom::micro_batches<4>, loom::gpipe>, loom::mpi_comm>>(
          "the example's cnn, 2 stages, 4 micro-batches, GPipe", 20, 64);
      // Batches of 6 in 8 micro-batches: two are empty, and their messages carry nothing.
      equivalence<mlp, loom::model_parallel<loom::pipeline<2, loom::micro_batches<8>, loom::one_f_one_b>, loom::mpi_comm>>(
          "mlp, 2 stages, batches of 6 in 8 micro-batches, 1F1B", 20, 6);
    } else if (comm.size() == 4) {
      equivalence<mlp, loom::model_parallel<loom::pipeline<4, loom::micro_batches<4>, loom::one_f_one_b>, loom::mpi_comm>>(
          "mlp, 4 stages, 4 micro-batches, 1F1B", 20, 64);
      equivalence<mlp, loom::model_parallel<loom::pipeline<4, loom::micro_batches<4>, loom::gpipe>, loom::mpi_comm>>(
          "mlp, 4 stages, 4 micro-batches, GPipe", 20, 64);
      equivalence<mlp, loom::hybrid<mpi_dp, loom::pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>>>(
          "mlp, 2 replicas x 2 stages, 4 micro-batches, 1F1B", 20, 64);
    } else {
      check(false, "run under mpirun -np 2 or -np 4, not " + std::to_string(comm.size()));
    }
  } catch (const loom::error& e) {
    // The other stages may be waiting on this one: end the whole job rather than hang.
    std::fprintf(stderr, "rank %d: FAILED: %s\n", comm.rank(), e.what());
    comm.abort(1, e.what());
  }
  return finish(comm);
}
