// SPDX-License-Identifier: Apache-2.0
#pragma once
// The default backend of loom::model and loom::trainer: loom::cpu, defined when oneDNN's header
// is there to build it. It is only declared (naming it is then an incomplete-type error) when
// oneDNN is missing, when LOOM_WITHOUT_CPU_BACKEND is defined, and in code compiled by nvcc,
// whose front end cannot parse oneDNN's C++ header: CUDA programs name loom::cuda, and a test
// comparing the two backends runs the CPU side in a translation unit of its own.

#if __has_include(<dnnl.hpp>) && !defined(LOOM_WITHOUT_CPU_BACKEND) && !defined(__CUDACC__)
#include "loom/backend/cpu.hpp"
#else
#include "loom/backend/cpu/runtime.hpp"  // set_threads: the host's threads exist without oneDNN too
namespace loom {
struct cpu;
}  // namespace loom
#endif
