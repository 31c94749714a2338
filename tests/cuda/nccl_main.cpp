// SPDX-License-Identifier: Apache-2.0
// Catch2's main for the nccl_comm tests, run under mpirun inside loom::mpi::environment. Every
// rank needs a GPU of its own: with fewer CUDA devices on a host than ranks there, every rank
// prints why and exits with 77, which CTest reports as skipped. Otherwise the exit code is
// nonzero when any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstdio>

#include "loom/backend/cuda/runtime.hpp"
#include "loom/comm/mpi.hpp"

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto world = loom::mpi_comm::world();
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node);
  int local_ranks = 1;
  MPI_Comm_size(node, &local_ranks);
  MPI_Comm_free(&node);
  const int devices = loom::cuda_device_count();
  int skip = devices < local_ranks ? 1 : 0;
  world.allreduce(&skip, 1, loom::reduce_op::max);
  if (skip) {
    if (world.rank() == 0) {
      if (devices == 0)
        std::printf("no CUDA device: skipped\n");
      else
        std::printf("%d ranks on a host with %d CUDA device%s (one GPU per rank): skipped\n", local_ranks, devices,
                    devices == 1 ? "" : "s");
    }
    return 77;
  }
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run() != 0 ? 1 : 0;
  const int mine = failed;
  world.allreduce(&failed, 1, loom::reduce_op::max);
  if (failed && !mine) std::fprintf(stderr, "test_nccl: rank %d passed, but another rank failed\n", world.rank());
  return failed;
}
