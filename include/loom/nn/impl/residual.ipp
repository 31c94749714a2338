// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of residual.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/nn/residual.hpp"

namespace loom::detail {

LOOM_DECL void residual_text(layer_description& d) { d.text = "residual<" + joined_text(d.inner) + ">"; }

LOOM_DECL std::string residual_onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
  const std::string f = g.layers(d.inner, x);
  return g.add_node("Add", {x, f});
}

}  // namespace loom::detail
