// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of dnnl_support.hpp's non-template functions: included at the end of the
// header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/backend/cpu/impl/onednn.hpp"

#include <deque>
#include <mutex>

namespace loom::detail {

/// The desc of a (n, c, h, w) activation in format f.
inline dnnl::memory::desc desc_of(const cpu_format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  return f.plain() ? plain_nchw(n, c, h, w) : f.layout->desc;
}

/// Room in s for a tensor of desc d, whatever its element type.
inline void* room_for(scratch& s, const dnnl::memory::desc& d) {
  return s.get((d.get_size() + sizeof(float) - 1) / sizeof(float));
}

LOOM_DECL const dnnl_layout* interned_layout(const dnnl::memory::desc& d) {
  // Few distinct layouts exist in a program (a convolution's output per batch size and math
  // mode): a list searched under a lock, on the creation of primitives only.
  static std::mutex m;
  static std::deque<dnnl_layout> all;  // stable addresses
  std::lock_guard<std::mutex> hold(m);
  for (const dnnl_layout& l : all)
    if (l.desc == d) return &l;
  return &all.emplace_back(dnnl_layout{d});
}

inline dnnl::memory::desc blocked_nchw_desc(std::size_t n, std::size_t c, std::size_t h, std::size_t w, std::size_t block) {
  using dt = dnnl::memory::dim;
  using tag = dnnl::memory::format_tag;
  return {{static_cast<dt>(n), static_cast<dt>(c), static_cast<dt>(h), static_cast<dt>(w)},
          dnnl::memory::data_type::f32,
          block == 16 ? tag::nChw16c : tag::nChw8c};
}

LOOM_DECL cpu_format blocked_nchw(std::size_t n, std::size_t c, std::size_t h, std::size_t w, std::size_t block) {
  return {interned_layout(blocked_nchw_desc(n, c, h, w, block))};
}

inline dnnl::memory::desc channels_last_desc(std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  using dt = dnnl::memory::dim;
  return {{static_cast<dt>(n), static_cast<dt>(c), static_cast<dt>(h), static_cast<dt>(w)},
          dnnl::memory::data_type::f32,
          dnnl::memory::format_tag::nhwc};
}

LOOM_DECL cpu_format channels_last_nchw(std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  return {interned_layout(channels_last_desc(n, c, h, w))};
}

LOOM_DECL bool is_channels_last(const cpu_format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  return !f.plain() && n != 0 && f.layout->desc == channels_last_desc(n, c, h, w);
}

LOOM_DECL std::size_t channel_block(const cpu_format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  // No samples (a data-parallel rank without any in a short last batch, still taking part in
  // a synchronized batch norm's sums): no value to read, whatever oneDNN made of the layout.
  if (f.plain() || n == 0) return 1;
  for (std::size_t b : {16, 8})
    if (c % b == 0 && f.layout->desc == blocked_nchw_desc(n, c, h, w, b)) return b;
  if (f.layout->desc == channels_last_desc(n, c, h, w)) return c;
  return 0;
}

LOOM_DECL int cpu_vector_level() {
  static const int level = [] {
    const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto has = [&](dnnl::cpu_isa i) { return (effective & static_cast<unsigned>(i)) == static_cast<unsigned>(i); };
    if (has(dnnl::cpu_isa::avx512_core) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return 2;
    if (has(dnnl::cpu_isa::avx2) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
  }();
  return level;
}

LOOM_DECL layout_reorders::layout_reorders() : cache_(std::make_unique<reorder_cache>()) {}
LOOM_DECL layout_reorders::layout_reorders(layout_reorders&&) noexcept = default;
LOOM_DECL layout_reorders& layout_reorders::operator=(layout_reorders&&) noexcept = default;
LOOM_DECL layout_reorders::~layout_reorders() = default;

LOOM_DECL void layout_reorders::run(const cpu_format& from, const float* src, const cpu_format& to, float* dst,
                                    std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  if (!cache_) cache_ = std::make_unique<reorder_cache>();  // moved from
  cache_->run(desc_of(from, n, c, h, w), src, desc_of(to, n, c, h, w), dst);
}

}  // namespace loom::detail
