// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of pool2d.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/pool2d.hpp"

namespace loom::detail {

LOOM_DECL std::string pool2d_onnx(onnx_graph& g, const std::string& x, pool_kind kind, std::int64_t kernel,
                                  std::int64_t stride) {
  const std::int64_t k = kernel, s = stride;
  return g.add_float_node(kind == pool_kind::max ? "MaxPool" : "AveragePool", {x},
                          {onnx_attr("kernel_shape", {k, k}), onnx_attr("strides", {s, s})});
}

}  // namespace loom::detail
