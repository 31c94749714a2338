// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the file formats need to know about a network, as run-time values: each layer's
// description as the layer gives it (loom/layers/describe.hpp: its text, its tensors under the
// names torch.nn.Sequential of the same layer list gives them, its ONNX export), with the
// network's shapes and parameter count. The weights file (io/safetensors.hpp), checkpoints
// (io/checkpoint.hpp) and the ONNX exporter (io/onnx.hpp) read it; nothing here knows one layer
// from another.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/layers/describe.hpp"
#include "loom/nn/describe.hpp"
#include "loom/nn/network.hpp"

namespace loom::io {

using ::loom::layer_description;
using ::loom::tensor_description;

namespace detail {
LOOM_DECL std::string join(const std::vector<std::size_t>& v, const char* sep = ",");
}  // namespace detail

/// A whole network as the file formats see it.
struct network_description {
  std::vector<std::size_t> input_shape, output_shape;
  std::size_t parameter_count = 0;
  /// Values of its flat buffer of buffers (running statistics), 0 for most networks.
  std::size_t buffer_count = 0;
  std::vector<layer_description> layers;

  /// The network as text, "network<input<784>,linear<256>,relu,...>" (its layers' texts):
  /// tensor-parallel layers read as the linear they are whole.
  std::string text() const;
  /// A 64-bit FNV-1a hash of text(), as 16 hex digits: equal for the same layer list.
  std::string fingerprint() const;
  /// Every tensor, layer by layer: a layer's parameters (in flat-buffer order) and then its
  /// buffers (their offsets in the flat buffer of buffers; tensor_description::kind says which).
  std::vector<tensor_description> tensors() const;
};

namespace detail {

template <class Net>
struct network_describer;
template <std::size_t... D, class... Layers>
struct network_describer<network<input<D...>, Layers...>> {
  static network_description get() {
    using net = network<input<D...>, Layers...>;
    network_description n;
    n.input_shape = {D...};
    n.output_shape.assign(net::output_shape::dims.begin(), net::output_shape::dims.end());
    n.parameter_count = net::parameter_count;
    n.buffer_count = net::buffer_count;
    n.layers = ::loom::detail::describe_chain<typename net::chain, Layers...>("");
    return n;
  }
};

}  // namespace detail

/// The description of Network (a loom::network<input<...>, layers...>), from its layers' own
/// (a layer that does not describe itself stops the compiler with a sentence saying what to add).
/// Throws: loom::error when a layer's describe() gives the wrong parameter count.
template <class Network>
network_description describe() {
  static_assert(is_network_v<Network>, "loom::io::describe<Network> needs a loom::network<loom::input<...>, layers...>");
  return detail::network_describer<Network>::get();
}

}  // namespace loom::io

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/layer_description.ipp"
#endif
