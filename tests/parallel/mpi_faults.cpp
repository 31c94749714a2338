// SPDX-License-Identifier: Apache-2.0
// Failure cases of data_parallel over real processes, run by run_fault.cmake under mpirun:
//   mismatch   rank 1 asks for another batch size: every rank must stop with the message.
//   dead-peer  rank 1 dies (_Exit) between two fits: rank 0 must not wait forever.
//   throw      rank 1 fails with an exception: it ends the whole job with its message.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.hpp"
#include "loom/comm/mpi.hpp"

using namespace loom_test;
using mpi_dp = loom::data_parallel<loom::mpi_comm>;

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, mpi_dp> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
    if (mode == "mismatch") {
      t.fit(train_set(), steps(3, comm.rank() == 1 ? 32 : 64));
      std::printf("rank %d: fit returned although the ranks disagree\n", comm.rank());
      return 0;
    }
    t.fit(train_set(), steps(3, 64));
    if (mode == "dead-peer") {
      if (comm.rank() == 1) std::_Exit(9);
      t.fit(train_set(), steps(3, 64));  // rank 1 is gone: this must not hang
      std::printf("rank %d: second fit returned without its peer\n", comm.rank());
      return 0;
    }
    if (mode == "throw") {
      if (comm.rank() == 1) throw loom::data_error("loom: simulated failure on rank 1");
      t.fit(train_set(), steps(3, 64));
      return 0;
    }
    std::fprintf(stderr, "usage: mpi_faults mismatch|dead-peer|throw\n");
    return 2;
  } catch (const loom::error& e) {
    std::printf("rank %d caught: %s\n", comm.rank(), e.what());
    std::fflush(stdout);
    if (mode == "throw") comm.abort(3, e.what());
    return 3;
  }
}
