// SPDX-License-Identifier: Apache-2.0
// Catch2's main for the local_comm tests (test_comm); test_comm_mpi has its own, mpi_main.cpp.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
