// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of conv2d.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/conv2d.hpp"

namespace loom::detail {

LOOM_DECL std::string conv2d_onnx(onnx_graph& g, const layer_description& d, const std::string& x, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t pad, bool bias) {
  const std::int64_t k = kernel, s = stride, p = pad;
  const std::initializer_list<onnx_attribute> attributes{
      onnx_attr("dilations", {1, 1}), onnx_attr("group", 1), onnx_attr("kernel_shape", {k, k}),
      onnx_attr("pads", {p, p, p, p}), onnx_attr("strides", {s, s})};
  if (!bias) return g.add_float_node("Conv", {x, g.initializer(d.tensors[0])}, attributes);
  return g.add_float_node("Conv", {x, g.initializer(d.tensors[0]), g.initializer(d.tensors[1])}, attributes);
}

}  // namespace loom::detail
