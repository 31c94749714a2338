// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of activation.hpp's non-template functions (its layers' ONNX nodes): included at the end of
// the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/layers/activation.hpp"

namespace loom {

LOOM_DECL std::string relu::onnx(onnx_graph& g, const layer_description&, const std::string& x) {
  return g.add_node("Relu", {x});
}

LOOM_DECL std::string detail::leaky_relu_onnx(onnx_graph& g, const std::string& x, int slope_millis) {
  return g.add_node("LeakyRelu", {x}, {onnx_attr("alpha", static_cast<float>(slope_millis) / 1000.0f)});
}

LOOM_DECL std::string tanh::onnx(onnx_graph& g, const layer_description&, const std::string& x) {
  return g.add_node("Tanh", {x});
}

LOOM_DECL std::string sigmoid::onnx(onnx_graph& g, const layer_description&, const std::string& x) {
  return g.add_node("Sigmoid", {x});
}

LOOM_DECL std::string gelu::onnx(onnx_graph& g, const layer_description&, const std::string& x) {
  const std::string a = g.add_node("Mul", {x, g.constant(0.70710678118654752440f)});
  const std::string e = g.add_node("Erf", {a});
  const std::string b = g.add_node("Add", {e, g.constant(1.0f)});
  const std::string m = g.add_node("Mul", {x, b});
  return g.add_node("Mul", {m, g.constant(0.5f)});
}

}  // namespace loom
