// SPDX-License-Identifier: Apache-2.0
// The reference side: the cases of cases.hpp on the serial host backend that the GPU check
// compares loom::cuda against (reference_backend.hpp), compiled by g++.
#include "reference_backend.hpp"

#define LOOM_TEST_BACKEND loom::gpu_check::reference
#include "cases_impl.hpp"

LOOM_CUDA_TEST_PASS_CASES(LOOM_CUDA_TEST_INSTANTIATE_PASS)
LOOM_CUDA_TEST_TRAIN_CASES(LOOM_CUDA_TEST_INSTANTIATE_TRAIN)
