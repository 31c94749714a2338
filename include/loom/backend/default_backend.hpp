// SPDX-License-Identifier: Apache-2.0
#pragma once
// The default backend of loom::model and loom::trainer: loom::cpu, defined when oneDNN's header
// is there to build it (LOOM_HAS_DNNL: 1 when <dnnl.hpp> is found, unless defined before; a
// compile-fail test defines it 0 to play a machine without oneDNN). Where oneDNN is missing (or
// LOOM_WITHOUT_CPU_BACKEND is defined), loom::cpu stands for a template that, once code uses
// it, fails with a sentence saying what to install. In code compiled by nvcc, whose front end cannot parse oneDNN's C++ header, it is
// only declared: CUDA programs name loom::cuda, and a test comparing the two backends runs the
// CPU side in a translation unit of its own.

#ifndef LOOM_HAS_DNNL
#if __has_include(<dnnl.hpp>)
#define LOOM_HAS_DNNL 1
#else
#define LOOM_HAS_DNNL 0
#endif
#endif

#if LOOM_HAS_DNNL && !defined(LOOM_WITHOUT_CPU_BACKEND) && !defined(__CUDACC__)
#include "loom/backend/cpu.hpp"
#else
#include "loom/backend/cpu/runtime.hpp"  // set_threads: the host's threads exist without oneDNN too
namespace loom {
#if defined(__CUDACC__)
struct cpu;
#else
namespace detail {
template <class>
inline constexpr bool cpu_backend_is_built = false;
/// What loom::cpu is without oneDNN: naming it compiles, using it (a model or trainer on the
/// default backend) fails here first.
template <class Unused = void>
struct cpu_backend_without_onednn {
#if defined(LOOM_WITHOUT_CPU_BACKEND)
  static_assert(cpu_backend_is_built<Unused>,
                "loom::cpu, the default backend of loom::model and loom::trainer, is left out because "
                "LOOM_WITHOUT_CPU_BACKEND is defined: remove that definition, or name another backend "
                "(loom::cuda, in code compiled by nvcc)");
#else
  static_assert(cpu_backend_is_built<Unused>,
                "loom::cpu, the default backend of loom::model and loom::trainer, needs oneDNN, whose header "
                "<dnnl.hpp> was not found: install libdnnl-dev (apt-get install libdnnl-dev on Debian or "
                "Ubuntu; scripts/setup does), or name another backend (loom::cuda, in code compiled by nvcc)");
#endif
};
}  // namespace detail
using cpu = detail::cpu_backend_without_onednn<>;
#endif
}  // namespace loom
#endif
