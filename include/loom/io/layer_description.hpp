// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the file formats need to know about a network, as run-time values: each layer's kind,
// attributes, sample shapes and parameter tensors (names as torch.nn.Sequential of the same layer
// list gives them, PyTorch's shapes, offsets in the flat buffer). The weights file
// (io/safetensors.hpp) and the ONNX exporter (io/onnx.hpp) read it; the layers know nothing of
// either. loom::io::layer_traits is the customisation point for a layer of one's own.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/dropout.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/network.hpp"

namespace loom::io {

/// The kinds of layer the file formats know.
enum class layer_kind { linear, conv2d, relu, leaky_relu, tanh, sigmoid, gelu, max_pool2d, avg_pool2d, flatten,
                        layer_norm, dropout, residual };

/// One parameter tensor of a layer: its PyTorch name ("3.weight"), PyTorch shape, and where
/// its values are in the flat parameter buffer (offset and count, in scalars).
struct tensor_description {
  std::string name;
  std::vector<std::size_t> shape;
  std::size_t offset = 0;
  std::size_t count = 0;
};

/// One layer as the file formats see it.
struct layer_description {
  layer_kind kind = layer_kind::relu;
  /// Its name as torch.nn.Sequential gives it: its index, "3", or "3.1" inside a residual.
  std::string path;
  /// One sample's shapes in and out.
  std::vector<std::size_t> input_shape, output_shape;
  /// linear: outputs; conv2d: output channels.
  std::size_t outputs = 0;
  /// conv2d and pooling: square window, stride, padding on every side.
  std::size_t kernel = 0, stride = 0, pad = 0;
  /// leaky_relu: the negative slope, in thousandths; dropout: the rate, in percent.
  int millis_or_percent = 0;
  /// In flat-buffer order (weight, then bias).
  std::vector<tensor_description> tensors;
  /// residual: the inner layers.
  std::vector<layer_description> inner;
};

namespace detail {
LOOM_DECL std::string join(const std::vector<std::size_t>& v, const char* sep = ",");

LOOM_DECL std::string layer_text(const layer_description& d);

LOOM_DECL void collect(const std::vector<layer_description>& layers, std::vector<tensor_description>& out);
}  // namespace detail

/// A whole network as the file formats see it.
struct network_description {
  std::vector<std::size_t> input_shape, output_shape;
  std::size_t parameter_count = 0;
  std::vector<layer_description> layers;

  /// The network as text, "network<input<784>,linear<256>,relu,...>": tensor-parallel layers
  /// read as the linear they are whole.
  std::string text() const;
  /// A 64-bit FNV-1a hash of text(), as 16 hex digits: equal for the same layer list.
  std::string fingerprint() const;
  /// Every parameter tensor, in flat-buffer order.
  std::vector<tensor_description> tensors() const;
};

/// The customisation point: describe<In>(d) fills d's kind, attributes and tensors (offsets
/// relative to the layer's first parameter) for layer L on one-sample input shape In; d's
/// path and shapes are already set. loom's layers (and types derived from them, such as
/// column_parallel<linear<N>>, described as that linear) are described here; specialise it for
/// a layer of your own.
template <class L>
struct layer_traits;

namespace detail {

template <class... L>
inline constexpr bool dependent_false = false;

template <class S>
std::vector<std::size_t> dims_of() {
  return {S::dims.begin(), S::dims.end()};
}

LOOM_DECL void add_tensor(layer_description& d, const char* what, std::vector<std::size_t> shape, std::size_t offset);

template <class Chain, class... Layers>
std::vector<layer_description> describe_chain(const std::string& prefix, std::size_t base);

// One overload per loom layer; a type derived from one (leaky_relu, dropout, column_parallel)
// binds to it by the derived-to-base conversion.
template <class In, std::size_t Out, class Init>
void describe_layer(const linear<Out, Init>*, layer_description& d) {
  d.kind = layer_kind::linear;
  d.outputs = Out;
  add_tensor(d, "weight", {Out, In::size}, 0);  // (out, in)
  add_tensor(d, "bias", {Out}, Out * In::size);
}
template <class In, std::size_t OC, std::size_t K, std::size_t S, std::size_t P, class Init>
void describe_layer(const conv2d<OC, K, S, P, Init>*, layer_description& d) {
  d.kind = layer_kind::conv2d;
  d.outputs = OC;
  d.kernel = K, d.stride = S, d.pad = P;
  add_tensor(d, "weight", {OC, In::dims[0], K, K}, 0);  // (out, in, kh, kw)
  add_tensor(d, "bias", {OC}, OC * In::dims[0] * K * K);
}
template <class In>
void describe_layer(const relu*, layer_description& d) { d.kind = layer_kind::relu; }
template <class In, int Slope>
void describe_layer(const leaky_relu_slope<Slope>*, layer_description& d) {
  d.kind = layer_kind::leaky_relu;
  d.millis_or_percent = Slope;
}
template <class In>
void describe_layer(const ::loom::tanh*, layer_description& d) { d.kind = layer_kind::tanh; }
template <class In>
void describe_layer(const sigmoid*, layer_description& d) { d.kind = layer_kind::sigmoid; }
template <class In>
void describe_layer(const gelu*, layer_description& d) { d.kind = layer_kind::gelu; }
template <class In, std::size_t K, std::size_t S>
void describe_layer(const max_pool2d<K, S>*, layer_description& d) {
  d.kind = layer_kind::max_pool2d;
  d.kernel = K, d.stride = S;
}
template <class In, std::size_t K, std::size_t S>
void describe_layer(const avg_pool2d<K, S>*, layer_description& d) {
  d.kind = layer_kind::avg_pool2d;
  d.kernel = K, d.stride = S;
}
template <class In>
void describe_layer(const flatten*, layer_description& d) { d.kind = layer_kind::flatten; }
template <class In>
void describe_layer(const layer_norm*, layer_description& d) {
  d.kind = layer_kind::layer_norm;
  add_tensor(d, "weight", dims_of<In>(), 0);  // the sample's whole shape, as nn.LayerNorm(shape)
  add_tensor(d, "bias", dims_of<In>(), In::size);
}
template <class In, unsigned Percent>
void describe_layer(const dropout_rate<Percent>*, layer_description& d) {
  d.kind = layer_kind::dropout;
  d.millis_or_percent = static_cast<int>(Percent);
}
template <class In, class... Inner>
void describe_layer(const residual<Inner...>*, layer_description& d) {
  d.kind = layer_kind::residual;
  // Offsets relative to the residual's first parameter, like every layer's.
  d.inner = describe_chain<layer_chain<In, Inner...>, Inner...>(d.path + ".", 0);
}

template <class L, class In>
concept described_by_loom = requires(layer_description& d) { describe_layer<In>(static_cast<const L*>(nullptr), d); };

}  // namespace detail

template <class L>
struct layer_traits {
  template <class In>
  static void describe(layer_description& d) {
    if constexpr (detail::described_by_loom<L, In>) {
      detail::describe_layer<In>(static_cast<const L*>(nullptr), d);
    } else {
      static_assert(detail::dependent_false<L, In>,
                    "loom::io does not know this layer, so it cannot save or export it: specialise "
                    "loom::io::layer_traits<Layer> with a describe<In>(layer_description&) that gives its kind, "
                    "attributes and parameter tensors (see loom/io/layer_description.hpp)");
    }
  }
};

namespace detail {

LOOM_DECL void shift(std::vector<layer_description>& layers, std::size_t by);

/// A described layer d of a chain: checks that its tensors (and its inner layers') hold
/// `parameters` values, makes their offsets absolute (the layer's parameters start at `at`) and
/// appends it to out. Throws loom::error naming the layer when a layer_traits describe() is wrong.
LOOM_DECL void add_described(layer_description&& d, std::size_t parameters, std::size_t at,
                             std::vector<layer_description>& out);

/// Describes one layer in compiled code: its path (prefix + index), one sample's shapes in and
/// out, then `describe` (its layer_traits' describe) fills the rest, and add_described appends
/// it (its parameters at `at`). The templates below only hand over their compile-time facts.
LOOM_DECL void describe_into(const std::string& prefix, std::size_t index, const std::size_t* in, std::size_t in_rank,
                             const std::size_t* out_dims, std::size_t out_rank, void (*describe)(layer_description&),
                             std::size_t parameters, std::size_t at, std::vector<layer_description>& out);

/// Layer I of Chain (L), described, its offsets made absolute (base: where Chain's parameters
/// start), appended to out.
template <class Chain, std::size_t I, class L>
void describe_at(const std::string& prefix, std::size_t base, std::vector<layer_description>& out) {
  using In = typename Chain::template input_of<I>;
  using Out = typename Chain::template output_of<I>;
  describe_into(prefix, I, In::dims.data(), In::dims.size(), Out::dims.data(), Out::dims.size(),
                &layer_traits<L>::template describe<In>, Chain::parameter_counts[I], base + Chain::parameter_offsets[I],
                out);
}

template <class Chain, class... Layers, std::size_t... I>
void describe_each(const std::string& prefix, std::size_t base, std::vector<layer_description>& out,
                   std::index_sequence<I...>) {
  (describe_at<Chain, I, Layers>(prefix, base, out), ...);
}

template <class Chain, class... Layers>
std::vector<layer_description> describe_chain(const std::string& prefix, std::size_t base) {
  std::vector<layer_description> out;
  describe_each<Chain, Layers...>(prefix, base, out, std::index_sequence_for<Layers...>{});
  return out;
}

template <class Net>
struct network_describer;
template <std::size_t... D, class... Layers>
struct network_describer<network<input<D...>, Layers...>> {
  static network_description get() {
    using net = network<input<D...>, Layers...>;
    network_description n;
    n.input_shape = {D...};
    n.output_shape = dims_of<typename net::output_shape>();
    n.parameter_count = net::parameter_count;
    n.layers = describe_chain<typename net::chain, Layers...>("", 0);
    return n;
  }
};

}  // namespace detail

/// The description of Network (a loom::network<input<...>, layers...>).
/// Throws: loom::error when a layer_traits specialisation describes the wrong parameter count.
template <class Network>
network_description describe() {
  static_assert(is_network_v<Network>, "loom::io::describe<Network> needs a loom::network<loom::input<...>, layers...>");
  return detail::network_describer<Network>::get();
}

}  // namespace loom::io

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/layer_description.ipp"
#endif
