// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one host/device macro and the library version. Nothing here depends on any toolkit.

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__
#else
#define LOOM_HD
#endif

// A kernel body that is always inlined into its loop: on the CPU into loops compiled for a wider
// vector ISA than the rest of the program (backend/cpu/pool2d.hpp), which a call would leave.
#if defined(__CUDACC__)
#define LOOM_HD_INLINE __host__ __device__ __forceinline__
#else
#define LOOM_HD_INLINE [[gnu::always_inline]] inline
#endif

// Separate compilation (README.md, "Compiling loom's non-template code once"). By default
// loom is header-only: every non-template function is `inline`, and each translation unit
// that uses one compiles it again. With LOOM_SEPARATE_COMPILATION defined (CMake: link
// loom::compiled, which defines it), the headers of io/, data/ and monitor/ only declare their
// non-template functions, and src/loom.cpp (which defines LOOM_SOURCE) compiles their
// definitions once, into the static library loom_compiled. Templates, constexpr functions and
// the small functions called per step or per element stay inline in the headers either way.
//
//   LOOM_DECL                 on those functions' declarations and definitions: `inline` when
//                             header-only, nothing under LOOM_SEPARATE_COMPILATION
//   LOOM_DEFINITIONS_VISIBLE  defined where the headers include their definitions
//                             (loom/<folder>/impl/*.ipp): header-only, or the library's source
#if defined(LOOM_SEPARATE_COMPILATION)
#define LOOM_DECL
#if defined(LOOM_SOURCE)
#define LOOM_DEFINITIONS_VISIBLE 1
#endif
#else
#if defined(LOOM_SOURCE)
#error "LOOM_SOURCE (src/loom.cpp) needs LOOM_SEPARATE_COMPILATION: without it there is nothing to compile once"
#endif
#define LOOM_DECL inline
#define LOOM_DEFINITIONS_VISIBLE 1
#endif

// The MPI part likewise (README.md, same section): with LOOM_SEPARATE_COMPILATION_MPI defined
// (CMake: link loom::compiled_mpi, which defines it and brings loom::compiled and loom::mpi),
// loom/comm/mpi_recovery.hpp only declares its non-template functions (the recovery protocol,
// the spawn of replacements), and src/loom_mpi.cpp (LOOM_SOURCE_MPI) compiles them once.
//
//   LOOM_MPI_DECL                 as LOOM_DECL, for those functions
//   LOOM_MPI_DEFINITIONS_VISIBLE  as LOOM_DEFINITIONS_VISIBLE (loom/comm/impl/*.ipp)
#if defined(LOOM_SEPARATE_COMPILATION_MPI)
#define LOOM_MPI_DECL
#if defined(LOOM_SOURCE_MPI)
#define LOOM_MPI_DEFINITIONS_VISIBLE 1
#endif
#else
#if defined(LOOM_SOURCE_MPI)
#error "LOOM_SOURCE_MPI (src/loom_mpi.cpp) needs LOOM_SEPARATE_COMPILATION_MPI: without it there is nothing to compile once"
#endif
#define LOOM_MPI_DECL inline
#define LOOM_MPI_DEFINITIONS_VISIBLE 1
#endif

// Templates that loom itself instantiates with its own types (float on the CPU backend,
// loom::mpi_comm, ...) are compiled once likewise: after such a template, its header names those
// instantiations with
//
//   LOOM_INSTANTIATE(declaration)      `extern template declaration;` under
//                                      LOOM_SEPARATE_COMPILATION (the translation unit uses the
//                                      one in loom_compiled), `template declaration;` in
//                                      src/loom.cpp (which compiles it), nothing header-only
//   LOOM_INSTANTIATE_MPI(declaration)  the same with LOOM_SEPARATE_COMPILATION_MPI and
//                                      src/loom_mpi.cpp, for those that involve MPI
//
// A translation unit that uses other types (double, a user's communicator) instantiates those
// itself, as always; the inline small ones may still be inlined where they are called.
#if defined(LOOM_SEPARATE_COMPILATION) && defined(LOOM_SOURCE)
#define LOOM_INSTANTIATE(...) template __VA_ARGS__;
#elif defined(LOOM_SEPARATE_COMPILATION)
#define LOOM_INSTANTIATE(...) extern template __VA_ARGS__;
#else
#define LOOM_INSTANTIATE(...)
#endif
#if defined(LOOM_SEPARATE_COMPILATION_MPI) && defined(LOOM_SOURCE_MPI)
#define LOOM_INSTANTIATE_MPI(...) template __VA_ARGS__;
#elif defined(LOOM_SEPARATE_COMPILATION_MPI)
#define LOOM_INSTANTIATE_MPI(...) extern template __VA_ARGS__;
#else
#define LOOM_INSTANTIATE_MPI(...)
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

#include <cstddef>

namespace loom {
using index_t = std::size_t;
}  // namespace loom
