// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one host/device macro and the library version. Nothing here depends on any toolkit.

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__
#else
#define LOOM_HD
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

#include <cstddef>

namespace loom {
using index_t = std::size_t;
}  // namespace loom
