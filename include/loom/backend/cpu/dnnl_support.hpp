// SPDX-License-Identifier: Apache-2.0
#pragma once
// oneDNN plumbing for the CPU backend: the engine and stream, the activation format (the
// physical layout oneDNN chose for a (batch, C, H, W) tensor), reorders and error wrapping.

#include <dnnl.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "loom/backend/cpu/signals.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"

namespace loom {

/// The physical layout of a CPU activation. Empty: plain row-major (batch, features...).
/// Otherwise a oneDNN layout (e.g. nChw16c) chosen by a convolution or pooling primitive and
/// kept between layers so no reorder runs on every call. loom only keeps layouts without
/// padding, so a buffer always holds exactly batch * sample_size elements and element-wise
/// layers can work on it as a flat array.
struct cpu_format {
  dnnl::memory::desc desc;  // zero desc = plain
  bool plain() const { return desc.is_zero(); }
  friend bool operator==(const cpu_format& a, const cpu_format& b) {
    if (a.plain() || b.plain()) return a.plain() == b.plain();
    return a.desc == b.desc;
  }
};

namespace detail {

inline dnnl::engine& dnnl_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
inline dnnl::stream& dnnl_stream() {
  static dnnl::stream s(dnnl_engine());
  return s;
}

/// Runs f, turning a oneDNN failure into loom::backend_error naming what loom was doing, with
/// the asynchronous signals held off this thread meanwhile (signals.hpp says why).
template <class F>
decltype(auto) dnnl_checked(const char* what, F&& f) {
  signal_shield shield;
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw backend_error(std::string("loom: oneDNN failed while ") + what + ": " + e.what() +
                        " (status " + std::to_string(static_cast<int>(e.status)) + ")");
  }
}

inline dnnl::memory::desc plain_nchw(std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  using dt = dnnl::memory::dim;
  return {{static_cast<dt>(n), static_cast<dt>(c), static_cast<dt>(h), static_cast<dt>(w)},
          dnnl::memory::data_type::f32,
          dnnl::memory::format_tag::nchw};
}

/// The desc of a (n, c, h, w) activation in format f.
inline dnnl::memory::desc desc_of(const cpu_format& f, std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  return f.plain() ? plain_nchw(n, c, h, w) : f.desc;
}

/// True when a layout holds exactly the logical elements (no padding of blocked dimensions).
inline bool unpadded(const dnnl::memory::desc& d, std::size_t elements) {
  return d.get_size() == elements * sizeof(float);
}

/// Copies src (layout `from`) into dst (layout `to`) with a cached reorder primitive.
class reorder_cache {
 public:
  /// src and dst hold the types their descs name (f32, or bf16 for a conversion).
  LOOM_DECL void run(const dnnl::memory::desc& from, const void* src, const dnnl::memory::desc& to, void* dst);

 private:
  struct entry {
    dnnl::memory::desc from, to;
    dnnl::reorder prim;
  };
  LOOM_DECL static void exec(entry& e, const void* src, void* dst);
  std::vector<entry> entries_;
};

/// Scratch storage that grows on demand and is reused across steps.
class scratch {
 public:
  float* get(std::size_t n) {
    buf_.reserve_discard(n);
    return buf_.data();
  }
  /// Room for a tensor of desc d, whatever its element type.
  void* get(const dnnl::memory::desc& d) { return get((d.get_size() + sizeof(float) - 1) / sizeof(float)); }

 private:
  buffer<float> buf_;
};

}  // namespace detail
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/dnnl_support.ipp"
#endif
