// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of dnnl_support.hpp's non-template functions: included at the end of the
// header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/backend/cpu/dnnl_support.hpp"

namespace loom::detail {

LOOM_DECL void reorder_cache::run(const dnnl::memory::desc& from, const void* src, const dnnl::memory::desc& to, void* dst) {
  for (auto& e : entries_)
    if (e.from == from && e.to == to) return exec(e, src, dst);
  entries_.push_back(dnnl_checked("creating a reorder", [&] {
    return entry{from, to, dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to))};
  }));
  exec(entries_.back(), src, dst);
}

LOOM_DECL void reorder_cache::exec(entry& e, const void* src, void* dst) {
  dnnl::memory s(e.from, dnnl_engine(), const_cast<void*>(src));
  dnnl::memory d(e.to, dnnl_engine(), dst);
  dnnl_checked("running a reorder", [&] {
    e.prim.execute(dnnl_stream(), s, d);
    dnnl_stream().wait();
  });
}

}  // namespace loom::detail
