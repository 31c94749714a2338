// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of layer_description.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/io/layer_description.hpp"

namespace loom::io {
namespace detail {

LOOM_DECL std::string join(const std::vector<std::size_t>& v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(v[i]);
  }
  return s;
}

LOOM_DECL std::string layer_text(const layer_description& d) {
  const std::string k = std::to_string(d.kernel), s = std::to_string(d.stride);
  switch (d.kind) {
    case layer_kind::linear: return "linear<" + std::to_string(d.outputs) + ">";
    case layer_kind::conv2d: return "conv2d<" + std::to_string(d.outputs) + "," + k + "," + s + "," + std::to_string(d.pad) + ">";
    case layer_kind::relu: return "relu";
    case layer_kind::leaky_relu: return "leaky_relu_slope<" + std::to_string(d.millis_or_percent) + ">";
    case layer_kind::tanh: return "tanh";
    case layer_kind::sigmoid: return "sigmoid";
    case layer_kind::gelu: return "gelu";
    case layer_kind::max_pool2d: return "max_pool2d<" + k + "," + s + ">";
    case layer_kind::avg_pool2d: return "avg_pool2d<" + k + "," + s + ">";
    case layer_kind::flatten: return "flatten";
    case layer_kind::layer_norm: return "layer_norm";
    case layer_kind::dropout: return "dropout_rate<" + std::to_string(d.millis_or_percent) + ">";
    case layer_kind::residual: {
      std::string t = "residual<";
      for (std::size_t i = 0; i < d.inner.size(); ++i) {
        if (i) t += ',';
        t += layer_text(d.inner[i]);
      }
      return t + ">";
    }
  }
  return "?";
}

LOOM_DECL void collect(const std::vector<layer_description>& layers, std::vector<tensor_description>& out) {
  for (const auto& l : layers) {
    out.insert(out.end(), l.tensors.begin(), l.tensors.end());
    collect(l.inner, out);
  }
}
}  // namespace detail
}  // namespace loom::io

namespace loom::io {

LOOM_DECL std::string network_description::text() const {
  std::string t = "network<input<" + detail::join(input_shape) + ">";
  for (const auto& l : layers) {
    t += ',';
    t += detail::layer_text(l);
  }
  return t + ">";
}

LOOM_DECL std::string network_description::fingerprint() const {
  std::uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : text()) h = (h ^ c) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

LOOM_DECL std::vector<tensor_description> network_description::tensors() const {
  std::vector<tensor_description> out;
  detail::collect(layers, out);
  return out;
}
}  // namespace loom::io

namespace loom::io {
namespace detail {

LOOM_DECL void add_tensor(layer_description& d, const char* what, std::vector<std::size_t> shape, std::size_t offset) {
  std::size_t n = 1;
  for (auto e : shape) n *= e;
  d.tensors.push_back({d.path + "." + what, std::move(shape), offset, n});
}

LOOM_DECL void shift(std::vector<layer_description>& layers, std::size_t by) {
  for (auto& l : layers) {
    for (auto& t : l.tensors) t.offset += by;
    shift(l.inner, by);
  }
}

LOOM_DECL void add_described(layer_description&& d, std::size_t parameters, std::size_t at,
                             std::vector<layer_description>& out) {
  std::size_t described = 0;
  for (const auto& t : d.tensors) described += t.count;
  std::vector<tensor_description> inner;
  collect(d.inner, inner);
  for (const auto& t : inner) described += t.count;
  if (described != parameters)
    throw error("loom::io: layer " + d.path + " (" + layer_text(d) + ") is described with " + std::to_string(described) +
                " parameters but has " + std::to_string(parameters) + ": its loom::io::layer_traits describe() is wrong");
  for (auto& t : d.tensors) t.offset += at;
  shift(d.inner, at);
  out.push_back(std::move(d));
}

LOOM_DECL void describe_into(const std::string& prefix, std::size_t index, const std::size_t* in, std::size_t in_rank,
                             const std::size_t* out_dims, std::size_t out_rank, void (*describe)(layer_description&),
                             std::size_t parameters, std::size_t at, std::vector<layer_description>& out) {
  layer_description d;
  d.path = prefix + std::to_string(index);
  d.input_shape.assign(in, in + in_rank);
  d.output_shape.assign(out_dims, out_dims + out_rank);
  describe(d);
  add_described(std::move(d), parameters, at, out);
}

}  // namespace detail
}  // namespace loom::io
