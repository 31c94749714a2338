// SPDX-License-Identifier: Apache-2.0
#pragma once
// oneDNN's C++ API as the CPU backend's definitions use it: the engine and stream, error
// wrapping, memory descriptors of activations, and a cache of reorder primitives. Included only
// by the backend's impl/*.ipp files (so, with loom::compiled, only by src/loom.cpp): the
// backend's headers name no oneDNN type (dnnl_support.hpp says why). It includes no header of
// loom's that includes an impl/*.ipp, so that whichever is included first, no cycle leaves a
// definition half-seen.

#include <dnnl.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "loom/backend/cpu/signals.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::detail {

/// What a non-plain cpu_format points to: one per distinct desc (interned_layout).
struct dnnl_layout {
  dnnl::memory::desc desc;
};
/// The one dnnl_layout of desc d (made on first use, never freed; impl/dnnl_support.ipp).
LOOM_DECL const dnnl_layout* interned_layout(const dnnl::memory::desc& d);

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

/// True when a layout holds exactly the logical elements (no padding of blocked dimensions).
inline bool unpadded(const dnnl::memory::desc& d, std::size_t elements) {
  return d.get_size() == elements * sizeof(float);
}

/// Copies src (layout `from`) into dst (layout `to`) with a cached reorder primitive.
class reorder_cache {
 public:
  /// src and dst hold the types their descs name (f32, or bf16 for a conversion).
  void run(const dnnl::memory::desc& from, const void* src, const dnnl::memory::desc& to, void* dst) {
    for (auto& e : entries_)
      if (e.from == from && e.to == to) return exec(e, src, dst);
    entries_.push_back(dnnl_checked("creating a reorder", [&] {
      return entry{from, to, dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to))};
    }));
    exec(entries_.back(), src, dst);
  }

 private:
  struct entry {
    dnnl::memory::desc from, to;
    dnnl::reorder prim;
  };
  static void exec(entry& e, const void* src, void* dst) {
    dnnl::memory s(e.from, dnnl_engine(), const_cast<void*>(src));
    dnnl::memory d(e.to, dnnl_engine(), dst);
    dnnl_checked("running a reorder", [&] {
      e.prim.execute(dnnl_stream(), s, d);
      dnnl_stream().wait();
    });
  }
  std::vector<entry> entries_;
};

}  // namespace loom::detail
