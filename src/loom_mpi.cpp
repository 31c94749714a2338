// SPDX-License-Identifier: Apache-2.0
// The MPI part of loom's separate compilation (the CMake target loom::compiled_mpi; see
// loom/core/config.hpp and README.md): defines LOOM_SOURCE_MPI and includes the headers of
// comm/ whose non-template functions are declared there and defined in their impl/*.ipp, so
// that those definitions (the recovery protocol, the spawn of replacements) are compiled here
// once, not inline in every translation unit that uses them; and the instantiations for
// loom::mpi_comm that the headers name with LOOM_INSTANTIATE_MPI (the communicator's
// collectives for float and the other element types loom sends, the trainer's recovery,
// job check and figures over mpi_comm). Links loom::compiled and loom::mpi.
#ifndef LOOM_SEPARATE_COMPILATION_MPI
#define LOOM_SEPARATE_COMPILATION_MPI
#endif
#define LOOM_SOURCE_MPI

#include "loom/comm/mpi.hpp"
#include "loom/comm/mpi_recovery.hpp"
// After mpi.hpp: its instantiations for mpi_comm need the class complete.
#include "loom/train/trainer.hpp"
