// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of flatten.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/flatten.hpp"

namespace loom {

LOOM_DECL std::string flatten::onnx(onnx_graph& g, const layer_description&, const std::string& x) {
  return g.add_node("Flatten", {x}, {onnx_attr("axis", 1)});
}

}  // namespace loom
