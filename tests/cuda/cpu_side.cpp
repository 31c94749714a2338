// SPDX-License-Identifier: Apache-2.0
// The CPU side of the CUDA tests: the cases of cases.hpp on loom::cpu (oneDNN), compiled by g++.
#include "loom/backend/cpu.hpp"

#define LOOM_TEST_BACKEND loom::cpu
#include "cases_impl.hpp"

LOOM_CUDA_TEST_PASS_CASES(LOOM_CUDA_TEST_INSTANTIATE_PASS)
LOOM_CUDA_TEST_TRAIN_CASES(LOOM_CUDA_TEST_INSTANTIATE_TRAIN)
