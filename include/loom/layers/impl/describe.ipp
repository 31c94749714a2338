// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of describe.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <utility>

#include "loom/core/error.hpp"
#include "loom/layers/describe.hpp"

namespace loom {

LOOM_DECL void layer_description::set_text(std::string_view name, std::initializer_list<std::int64_t> arguments) {
  text.assign(name);
  if (arguments.size() == 0) return;
  char sep = '<';
  for (std::int64_t a : arguments) {
    text += sep;
    text += std::to_string(a);
    sep = ',';
  }
  text += '>';
}

LOOM_DECL tensor_description& layer_description::parameter(std::string_view name, std::span<const std::size_t> shape) {
  std::size_t offset = 0, count = 1;
  for (const auto& t : tensors)
    if (t.kind == tensor_kind::parameter) offset += t.count;
  for (auto e : shape) count *= e;
  tensors.push_back({path + "." + std::string(name), {shape.begin(), shape.end()}, offset, count, tensor_kind::parameter});
  return tensors.back();
}

LOOM_DECL tensor_description& layer_description::buffer(std::string_view name, std::span<const std::size_t> shape,
                                                         tensor_element element) {
  std::size_t offset = 0, count = 1;
  for (const auto& t : tensors)
    if (t.kind == tensor_kind::buffer) offset += t.count;
  for (auto e : shape) count *= e;
  tensors.push_back(
      {path + "." + std::string(name), {shape.begin(), shape.end()}, offset, count, tensor_kind::buffer, element});
  return tensors.back();
}

LOOM_DECL onnx_attribute onnx_attr(std::string_view name, std::initializer_list<std::int64_t> v) {
  if (v.size() > onnx_attribute::max_integers)
    throw invalid_argument("loom::onnx_attr(\"" + std::string(name) + "\"): " + std::to_string(v.size()) +
                           " integers, more than an onnx_attribute holds (" +
                           std::to_string(onnx_attribute::max_integers) + ")");
  onnx_attribute a{name, onnx_attribute::type::integers};
  for (std::int64_t x : v) a.integers[a.integer_count++] = x;
  return a;
}

LOOM_DECL std::string joined_text(const std::vector<layer_description>& layers) {
  std::string t;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (i) t += ',';
    t += layers[i].text;
  }
  return t;
}

namespace detail {

LOOM_DECL void collect(const std::vector<layer_description>& layers, std::vector<tensor_description>& out) {
  for (const auto& l : layers) {
    out.insert(out.end(), l.tensors.begin(), l.tensors.end());
    collect(l.inner, out);
  }
}

/// Adds `by` to the offsets of every parameter tensor of layers and of their inner layers, and
/// `buffers_by` to those of every buffer tensor.
LOOM_DECL void shift(std::vector<layer_description>& layers, std::size_t by, std::size_t buffers_by) {
  for (auto& l : layers) {
    for (auto& t : l.tensors) t.offset += t.kind == tensor_kind::buffer ? buffers_by : by;
    shift(l.inner, by, buffers_by);
  }
}

LOOM_DECL void describe_into(const std::string& prefix, const chain_slot& slot, const std::size_t* in,
                             std::size_t in_rank, const std::size_t* out_dims, std::size_t out_rank,
                             void (*describe)(layer_description&), onnx_function onnx,
                             std::vector<layer_description>& out) {
  layer_description d;
  d.path = prefix + (slot.name.empty() ? std::to_string(slot.index) : std::string(slot.name));
  d.input_shape.assign(in, in + in_rank);
  d.output_shape.assign(out_dims, out_dims + out_rank);
  describe(d);
  d.onnx = onnx;
  if (!slot.name.empty()) d.text = std::string(slot.name) + ":" + d.text;
  std::size_t params = 0, buffers = 0;
  std::vector<tensor_description> all = d.tensors;
  collect(d.inner, all);
  for (const auto& t : all) (t.kind == tensor_kind::buffer ? buffers : params) += t.count;
  if (params != slot.parameters)
    throw error("loom: layer " + d.path + " (" + d.text + ") is described with " + std::to_string(params) +
                " parameters but has " + std::to_string(slot.parameters) +
                ": its describe() (or its loom::layer_traits specialisation's) is wrong");
  if (buffers != slot.buffers)
    throw error("loom: layer " + d.path + " (" + d.text + ") is described with " + std::to_string(buffers) +
                " buffer values but holds " + std::to_string(slot.buffers) +
                ": its describe() (or its loom::layer_traits specialisation's) is wrong");
  for (auto& t : d.tensors) t.offset += t.kind == tensor_kind::buffer ? slot.buffer_at : slot.at;
  shift(d.inner, slot.at, slot.buffer_at);
  out.push_back(std::move(d));
}

}  // namespace detail
}  // namespace loom
