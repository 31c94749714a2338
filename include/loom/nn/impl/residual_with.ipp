// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of residual_with.hpp's non-template functions (its text and ONNX nodes):
// included at the end of the header (header-only), or compiled once in src/loom.cpp
// (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <utility>
#include <vector>

#include "loom/nn/residual_with.hpp"

namespace loom::detail {

LOOM_DECL void residual_with_text(layer_description& d, std::size_t main_layers) {
  const std::vector<layer_description> main(d.inner.begin(), d.inner.begin() + static_cast<std::ptrdiff_t>(main_layers));
  d.text = "residual_with<layers<" + joined_text(main) + ">";
  if (d.inner.size() > main_layers) d.text += "," + d.inner.back().text;
  d.text += ">";
}

LOOM_DECL std::string residual_with_onnx(onnx_graph& g, const layer_description& d, const std::string& x,
                                         std::size_t main_layers) {
  const std::vector<layer_description> main(d.inner.begin(), d.inner.begin() + static_cast<std::ptrdiff_t>(main_layers));
  const std::string f = g.layers(main, x);
  const std::string s = d.inner.size() > main_layers ? g.layers({d.inner.back()}, x) : x;
  return g.add_node("Add", {f, s});
}

LOOM_DECL std::string sequential_onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
  return g.layers(d.inner, x);
}

LOOM_DECL layer_description shortcut_description(const std::string& path, const std::vector<std::size_t>& in,
                                                 const std::vector<std::size_t>& out, std::vector<layer_description> inner) {
  layer_description s;
  s.path = path;
  s.input_shape = in;
  s.output_shape = out;
  s.inner = std::move(inner);
  const std::string name = path.substr(path.rfind('.') + 1);
  s.text = (name == "shortcut" ? std::string() : name + ":") + "shortcut<" + joined_text(s.inner) + ">";
  s.onnx = &sequential_onnx;
  return s;
}

}  // namespace loom::detail
