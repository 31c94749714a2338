// SPDX-License-Identifier: Apache-2.0
// Through an installed loom::compiled_mpi, as one MPI process (a singleton, no mpirun): turns on
// the failure detector (mpi_comm::watch_for_failures, compiled in loom::compiled_mpi), sums over
// the world through it, and parses a JSON text it quoted (loom::compiled's io/). The
// headers only declare those functions (LOOM_SEPARATE_COMPILATION, _MPI), so this links only
// when the installed libraries define them.
#include <cstdio>
#include <exception>
#include <cstdint>
#include <string>

#include "loom/comm/mpi.hpp"
#include "loom/comm/mpi_recovery.hpp"
#include "loom/io/json.hpp"

#if !defined(LOOM_SEPARATE_COMPILATION) || !defined(LOOM_SEPARATE_COMPILATION_MPI)
#error "loom::compiled_mpi must bring LOOM_SEPARATE_COMPILATION and LOOM_SEPARATE_COMPILATION_MPI"
#endif

int main(int argc, char** argv) {
  try {
    loom::mpi::environment env{argc, argv};
    auto world = loom::mpi_comm::world();
    world.watch_for_failures(30.0);
    if (!world.watch() || world.watch()->peers.size() != static_cast<std::size_t>(world.size())) {
      std::fprintf(stderr, "compiled_mpi consumer: the failure detector did not gather its peers\n");
      return 1;
    }
    double v[2] = {1.0, static_cast<double>(world.rank())};
    world.allreduce(v, 2, loom::reduce_op::sum);
    if (v[0] != world.size()) {
      std::fprintf(stderr, "compiled_mpi consumer: the watched allreduce gave %g, expected %d\n", v[0], world.size());
      return 1;
    }
    // JSON through loom::compiled: quote a text, parse the document it makes, read it back.
    const std::string text = "{" + loom::io::json::quote("ranks") + ": " + std::to_string(world.size()) + "}";
    const loom::io::json::value doc = loom::io::json::parse(text);
    std::uint64_t ranks = 0;
    const loom::io::json::value* member = doc.find("ranks");
    if (!member || !member->to_u64(ranks) || ranks != static_cast<std::uint64_t>(world.size())) {
      std::fprintf(stderr, "compiled_mpi consumer: the JSON text %s did not parse back\n", text.c_str());
      return 1;
    }
    std::printf("loom consumer: compiled_mpi, %d rank(s): a watched allreduce and JSON through the installed libraries\n",
                world.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compiled_mpi consumer: %s\n", e.what());
    return 1;
  }
}
