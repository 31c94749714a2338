// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of layer_norm.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/layer_norm.hpp"

namespace loom {

LOOM_DECL std::string layer_norm::onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
  return g.add_node("LayerNormalization", {x, g.initializer(d.tensors[0]), g.initializer(d.tensors[1])},
                    {onnx_attr("axis", 1), onnx_attr("epsilon", 1e-5f)});
}

}  // namespace loom
