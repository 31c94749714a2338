// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of pool2d.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/pool2d.hpp"

namespace loom::detail {

LOOM_DECL std::string pool2d_onnx(onnx_graph& g, const std::string& x, pool_kind kind, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t pad) {
  const std::int64_t k = kernel, s = stride, p = pad;
  if (p == 0)
    return g.add_float_node(kind == pool_kind::max ? "MaxPool" : "AveragePool", {x},
                            {onnx_attr("kernel_shape", {k, k}), onnx_attr("strides", {s, s})});
  if (kind == pool_kind::max)
    return g.add_float_node("MaxPool", {x},
                            {onnx_attr("kernel_shape", {k, k}), onnx_attr("pads", {p, p, p, p}), onnx_attr("strides", {s, s})});
  // loom divides by the whole window, padding included (PyTorch's count_include_pad default).
  return g.add_float_node("AveragePool", {x},
                          {onnx_attr("count_include_pad", 1), onnx_attr("kernel_shape", {k, k}),
                           onnx_attr("pads", {p, p, p, p}), onnx_attr("strides", {s, s})});
}

LOOM_DECL std::string global_avg_pool2d_onnx(onnx_graph& g, const std::string& x) {
  return g.add_node("Flatten", {g.add_float_node("GlobalAveragePool", {x})}, {onnx_attr("axis", 1)});
}

}  // namespace loom::detail
