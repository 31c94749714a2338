// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of linear.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/linear.hpp"

namespace loom::detail {

LOOM_DECL std::string linear_onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
  return g.add_node("Gemm", {x, g.initializer(d.tensors[0]), g.initializer(d.tensors[1])},
                    {onnx_attr("alpha", 1.0f), onnx_attr("beta", 1.0f), onnx_attr("transB", 1)});
}

}  // namespace loom::detail
