// SPDX-License-Identifier: Apache-2.0
// loom::memory_plan per rank, with ranks as processes (mpirun -np 2, CTest
// parallel.mpi.memory_plan): each rank measures what loom's buffers in its own process hold at
// their peak during fit (loom::host_memory) and compares it with its own for_rank(r) at its
// share of the batch — within 10% + 256 KiB, and exactly for the mlp, whose buffers do not
// depend on oneDNN's choices. Data parallelism (mlp, cnn; with and without ZeRO), a 2-stage 1F1B pipeline of the cnn
// and tensor parallelism of the mlp. Rank 0 prints each run's figures and "all checks passed".

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include "common.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"

using namespace loom_test;

namespace {

using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu, loom::linear<10>>;

template <class Net, class Policy>
void measure(const char* name, std::size_t batch, bool exact) {
  using plan = loom::memory_plan<Net, loom::sgd, Policy, loom::with_momentum>;
  auto comm = loom::mpi_comm::world();
  const auto data = train_set().first(4 * batch);  // whole batches only
  const std::size_t base = loom::host_memory().live_bytes;
  loom::reset_host_memory_peak();
  std::size_t share = 0, replicas = 1;
  loom::rank_figures fig;
  {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                         {.seed = 1, .threads = 1}};
    replicas = static_cast<std::size_t>(t.replicas());
    const std::size_t i = static_cast<std::size_t>(t.replica());
    share = batch * (i + 1) / replicas - batch * i / replicas;
    auto o = steps(4, batch);
    o.epochs = 1;
    fig = t.fit(data, o).figures[static_cast<std::size_t>(comm.rank())];
  }
  const std::size_t measured = loom::host_memory().peak_bytes - base;
  const loom::rank_memory& mine = plan::for_rank(static_cast<std::size_t>(comm.rank()));
  const std::size_t planned = mine.bytes_at(share, batch, replicas);
  const double off = (double(measured) - double(planned)) / double(planned);
  const std::string what = std::string(name) + ": rank " + std::to_string(comm.rank()) + " planned " +
                           std::to_string(planned) + " bytes, measured " + std::to_string(measured);
  check(std::abs(double(measured) - double(planned)) <= 0.10 * double(planned) + 256.0 * 1024, what + ": off by more than 10% + 256 KiB");
  if (exact) check(measured == planned, what + ": expected exactly the plan");
  // The per-rank table's columns: fit's own plan_MB and mem_MB (the process's peak, base included).
  check(fig.planned_bytes == double(planned), what + ": fit reports planned_bytes " + std::to_string(fig.planned_bytes));
  check(fig.memory_peak_bytes == double(base + measured),
        what + ": fit reports memory_peak_bytes " + std::to_string(fig.memory_peak_bytes) + ", expected " + std::to_string(base + measured));
  std::printf("memory_plan: %s rank %d of %zu replica(s): planned %zu, measured %zu (%+.2f%%)\n", name, comm.rank(),
              replicas, planned, measured, 100 * off);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  if (comm.size() != 2) {
    if (comm.rank() == 0) std::fprintf(stderr, "memory_plan_mpi: run on 2 ranks (mpirun -np 2)\n");
    return 1;
  }
  try {
    measure<mlp, loom::data_parallel<loom::mpi_comm>>("data_parallel mlp", 64, true);
    measure<cnn, loom::data_parallel<loom::mpi_comm>>("data_parallel cnn", 64, false);
    // ZeRO: the state, the reduced gradients and the parameters' copy of a shard of half the model.
    measure<mlp, loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>>("data_parallel mlp, ZeRO", 64, true);
    measure<cnn, loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>>("data_parallel cnn, ZeRO", 64, false);
    measure<cnn, loom::model_parallel<loom::pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>, loom::mpi_comm>>(
        "pipeline<2, 1f1b, 4 micro-batches> cnn", 64, false);
    measure<tp_mlp, loom::model_parallel<loom::tensor_parallel<2>, loom::mpi_comm>>("tensor_parallel<2> mlp", 64, true);
  } catch (const std::exception& e) {
    check(false, std::string("threw: ") + e.what());
  }
  return finish(comm);
}
