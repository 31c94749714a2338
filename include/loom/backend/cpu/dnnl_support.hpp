// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU backend's face of oneDNN: the activation format (the physical layout oneDNN chose for
// a (batch, C, H, W) tensor), the reorders between formats, and scratch storage. Nothing here
// names a oneDNN type: oneDNN's C++ header (~0.7 s of parsing per translation unit) is included
// only by the definitions (impl/onednn.hpp, through impl/*.ipp), so with loom::compiled
// (LOOM_SEPARATE_COMPILATION) a program's translation units never parse it.

#include <cstddef>
#include <memory>

#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"

namespace loom {

namespace detail {
/// A oneDNN memory descriptor (impl/onednn.hpp), complete only where oneDNN's header is.
/// Interned: one object per distinct layout, alive until the program ends.
struct dnnl_layout;
}  // namespace detail

/// The physical layout of a CPU activation. Plain: row-major (batch, features...). Otherwise a
/// oneDNN layout (e.g. nChw16c) chosen by a convolution and kept between layers so no reorder
/// runs on every call. loom only keeps layouts without padding, so a buffer always holds
/// exactly batch * sample_size elements and element-wise layers can work on it as a flat array.
/// A pointer to the interned layout: copied and compared as a pointer.
struct cpu_format {
  const detail::dnnl_layout* layout = nullptr;  // null = plain
  bool plain() const { return layout == nullptr; }
  friend bool operator==(const cpu_format&, const cpu_format&) = default;
};

namespace detail {

/// oneDNN's channel-blocked layout of a (n, c, h, w) float activation: nChw16c (block 16) or
/// nChw8c (block 8).
LOOM_DECL cpu_format blocked_nchw(std::size_t n, std::size_t c, std::size_t h, std::size_t w, std::size_t block);

/// oneDNN's channels-last layout of a (n, c, h, w) float activation (nhwc): what its bf16 (AMX)
/// convolutions write. Element (i, j, y, x) at ((i * h + y) * w + x) * c + j: the blocked
/// layout's formula with one block of all c channels.
LOOM_DECL cpu_format channels_last_nchw(std::size_t n, std::size_t c, std::size_t h, std::size_t w);

/// The channels per block of format f for a (n, c, h, w) float activation: 1 when plain, 8 or 16
/// for nChw8c / nChw16c, c for channels-last (nhwc: one block of every channel), 0 for any
/// other layout. For each of them element (i, j) at spatial place s (y * w + x) sits at
/// ((i * (c / B) + j / B) * h * w + s) * B + j % B.
LOOM_DECL std::size_t channel_block(const cpu_format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w);

/// Whether f is channels-last for a (n, c, h, w) float activation (false for n = 0).
LOOM_DECL bool is_channels_last(const cpu_format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w);

/// The widest vector ISA loom's own CPU loops are compiled for (batch_norm_rows, pooling) that
/// this CPU has and oneDNN runs too (ONEDNN_MAX_CPU_ISA limits both): 2 AVX-512 (F, BW, VL,
/// DQ), 1 AVX2 with FMA, 0 the baseline x86-64. Found once.
LOOM_DECL int cpu_vector_level();

class reorder_cache;  // impl/onednn.hpp

/// Copies (n, c, h, w) float activations between formats with reorder primitives created once
/// per pair of layouts and reused.
class layout_reorders {
 public:
  LOOM_DECL layout_reorders();
  LOOM_DECL layout_reorders(layout_reorders&&) noexcept;
  LOOM_DECL layout_reorders& operator=(layout_reorders&&) noexcept;
  LOOM_DECL ~layout_reorders();

  /// dst (format `to`) = src (format `from`), both (n, c, h, w) float activations.
  LOOM_DECL void run(const cpu_format& from, const float* src, const cpu_format& to, float* dst, std::size_t n,
                     std::size_t c, std::size_t h, std::size_t w);

 private:
  std::unique_ptr<reorder_cache> cache_;
};

/// Scratch storage that grows on demand and is reused across steps.
class scratch {
 public:
  float* get(std::size_t n) {
    buf_.reserve_discard(n);
    return buf_.data();
  }

 private:
  buffer<float> buf_;
};

}  // namespace detail
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/dnnl_support.ipp"
#endif
