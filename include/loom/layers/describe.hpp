// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a layer says about itself besides its shapes: how the file formats see it (its text in
// the network's fingerprint, its tensors under PyTorch's names), the ONNX nodes it exports as,
// and the buffers it holds (for loom::memory_plan). Every layer describes itself with the members
// listed in docs/layers.md ("Writing your own layer"), or through a loom::layer_traits
// specialisation; io/ and the memory plan only read those. This file is the vocabulary, not the
// file formats: safetensors, checkpoints and the ONNX protobuf are written in io/.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

// ---- The file formats' view of a layer ----------------------------------------------------------

/// What a tensor of a layer is to the file formats: a parameter (trained; its values in the
/// network's flat parameter buffer) or a buffer (part of the model but not trained, as PyTorch's
/// registered buffers: batch norm's running statistics; its values in the network's flat buffer
/// of buffers). Both are saved and loaded under PyTorch's names; only parameters have gradients
/// and optimizer state.
enum class tensor_kind : unsigned char { parameter, buffer };

/// How a tensor's values are held: as the model's scalars, or as a count (batch norm's
/// num_batches_tracked) — an integral value in one scalar of the flat buffer (exact up to 2^24 in
/// float), written to the files as int64, as PyTorch holds it.
enum class tensor_element : unsigned char { scalar, int64 };

/// One tensor of a layer: its PyTorch name ("3.weight"), its PyTorch shape, and where its values
/// are in the network's flat buffer of its kind (offset and count, in scalars).
struct tensor_description {
  std::string name;
  std::vector<std::size_t> shape;
  std::size_t offset = 0;
  std::size_t count = 0;
  tensor_kind kind = tensor_kind::parameter;
  tensor_element element = tensor_element::scalar;
};

class onnx_graph;
struct layer_description;

/// A layer's ONNX export: adds its nodes to g, reading the value named x, and returns the name of
/// its output (x itself for a layer that is the identity at inference).
using onnx_function = std::string (*)(onnx_graph& g, const layer_description& d, const std::string& x);

/// One layer as the file formats see it. loom fills path and shapes, the layer's describe()
/// the rest (its onnx() is kept beside it).
struct layer_description {
  /// Its name as torch.nn.Sequential gives it: its index, "3", or "3.1" inside a residual.
  std::string path;
  /// One sample's shapes in and out.
  std::vector<std::size_t> input_shape, output_shape;
  /// The layer as it reads in the network's text and fingerprint, "conv2d<32,3,1,1>": its name and
  /// every template argument that changes what its parameters mean (an initialiser does not).
  /// Checkpoints record it, so it must stay the same once written.
  std::string text;
  /// In flat-buffer order (weight, then bias), its parameters and its buffers each in their own
  /// flat buffer; offsets are from the layer's first parameter (first buffer) until loom makes
  /// them the network's.
  std::vector<tensor_description> tensors;
  /// A layer made of layers (loom::residual): theirs, paths "3.0", "3.1", ...
  std::vector<layer_description> inner;
  /// Its ONNX export (set by loom from the layer's onnx()).
  onnx_function onnx = nullptr;

  /// Sets text to `name`, or to "name<a,b,...>" with arguments.
  LOOM_DECL void set_text(std::string_view name, std::initializer_list<std::int64_t> arguments = {});
  /// Adds parameter tensor `name` ("weight": its PyTorch name is path + ".weight") of PyTorch shape
  /// `shape`, right after the layer's parameter tensors before it (the first at offset 0).
  LOOM_DECL tensor_description& parameter(std::string_view name, std::span<const std::size_t> shape);
  tensor_description& parameter(std::string_view name, std::initializer_list<std::size_t> shape) {
    return parameter(name, std::span<const std::size_t>(shape.begin(), shape.size()));
  }
  /// Adds buffer tensor `name` ("running_mean": path + ".running_mean") of PyTorch shape `shape`
  /// (empty: a scalar), right after the layer's buffer tensors before it in the network's flat
  /// buffer of buffers; `element` int64 for a count.
  LOOM_DECL tensor_description& buffer(std::string_view name, std::span<const std::size_t> shape,
                                       tensor_element element = tensor_element::scalar);
  tensor_description& buffer(std::string_view name, std::initializer_list<std::size_t> shape,
                             tensor_element element = tensor_element::scalar) {
    return buffer(name, std::span<const std::size_t>(shape.begin(), shape.size()), element);
  }
};

/// The texts of layers, joined by commas ("linear<16>,tanh").
LOOM_DECL std::string joined_text(const std::vector<layer_description>& layers);

// ---- ONNX ------------------------------------------------------------------------------------------

/// An attribute of an ONNX node: an integer, a float or a list of up to 8 integers. A literal
/// type, so that a layer's onnx() builds its nodes without allocating: its name must outlive the
/// add_node call (a string literal does).
struct onnx_attribute {
  enum class type : unsigned char { integer, real, integers };
  static constexpr std::size_t max_integers = 8;
  std::string_view name;
  type kind = type::integer;
  std::int64_t integer = 0;
  float real = 0;
  std::array<std::int64_t, max_integers> integers{};
  std::size_t integer_count = 0;
};

/// An integer attribute ("axis", 1).
template <std::integral I>
constexpr onnx_attribute onnx_attr(std::string_view name, I v) {
  return {name, onnx_attribute::type::integer, static_cast<std::int64_t>(v)};
}
/// A float attribute ("epsilon", 1e-5f).
constexpr onnx_attribute onnx_attr(std::string_view name, float v) {
  return {name, onnx_attribute::type::real, 0, v};
}
/// A list of integers ("pads", {1, 1, 1, 1}).
/// Throws: loom::invalid_argument for more than onnx_attribute::max_integers values.
LOOM_DECL onnx_attribute onnx_attr(std::string_view name, std::initializer_list<std::int64_t> v);

/// The ONNX graph a layer's onnx() adds its nodes to (opset 17 of the default domain). loom's
/// exporter (io/onnx.hpp) implements it: it names the nodes after the layer ("/3/Gemm"), and
/// converts the weights and the arithmetic to the export's precision.
class onnx_graph {
 public:
  virtual ~onnx_graph() = default;
  /// Adds node `op` on the values `inputs` and returns the name of its one output.
  virtual std::string add_node(std::string_view op, std::initializer_list<std::string_view> inputs,
                               std::initializer_list<onnx_attribute> attributes = {}) = 0;
  /// As add_node, for an operator opset 17 defines for float16, float and double only (Conv,
  /// MaxPool, AveragePool): in a bf16 export its inputs are cast to float and its output back.
  virtual std::string add_float_node(std::string_view op, std::initializer_list<std::string_view> inputs,
                                     std::initializer_list<onnx_attribute> attributes = {}) = 0;
  /// Tensor t of the layer as an initializer (its values from the network's parameters, in the
  /// export's precision, named as in the weights file); returns its name (t.name).
  virtual std::string_view initializer(const tensor_description& t) = 0;
  /// A scalar constant in the graph's element type; returns its name.
  virtual std::string constant(float v) = 0;
  /// The nodes of `layers` (a residual's inner layers) on input x; returns their output.
  virtual std::string layers(const std::vector<layer_description>& layers, const std::string& x) = 0;
};

// ---- Memory ----------------------------------------------------------------------------------------

/// What loom::sequence allocates for a layer or a run of layers, in scalars; a layer's footprint()
/// gives what its implementation holds itself, besides its output (the sequence holds that).
struct sequence_elements {
  std::size_t saved = 0;          // per sample: kept from forward for backward
  std::size_t scratch = 0;        // per sample: backward's gradient buffers, layout conversions
  std::size_t fixed_scratch = 0;  // whatever the batch (a convolution's weights in oneDNN's layout)
  std::size_t fixed_comm = 0;     // whatever the batch, for communication
  bool output_blocked = false;    // a run of layers: its last output comes in a channel-blocked layout
  constexpr void add(const sequence_elements& o) noexcept {
    saved += o.saved;
    scratch += o.scratch;
    fixed_scratch += o.fixed_scratch;
    fixed_comm += o.fixed_comm;
  }
};

/// Where a layer runs, as its footprint depends on it.
struct footprint_context {
  /// Its input comes in a channel-blocked layout (oneDNN's nChw16c, after a convolution).
  bool input_blocked = false;
  /// Backward is asked for its input gradient (every layer but a network's first).
  bool needs_input_gradient = false;
  /// Its parameter gradients are added to (a pipeline stage of several micro-batches).
  bool accumulates = false;
  /// The loom::relu after it runs inside it (detail::fuses_into_previous): it writes the ReLU's
  /// output itself.
  bool relu_fused_after = false;
};

/// How a layer's output layout follows from its input's (as its forward sets y.format): plain
/// row-major, the input's kept, or a channel-blocked one of its own.
enum class layout_effect : unsigned char { plain, keeps, blocks };

// ---- Where loom reads a layer's description ------------------------------------------------------

/// The customisation point for a layer one cannot edit: a specialisation with the members a layer
/// would have (describe and onnx; footprint and layout optionally, see docs/layers.md) describes
/// L, and takes precedence over L's own members.
template <class L>
struct layer_traits {};

namespace diagnostic {
/// Layer is in a network that is saved, checkpointed or exported, but does not describe itself.
template <class Layer>
struct layer_does_not_describe_itself;
}  // namespace diagnostic

namespace detail {

template <class L, class In>
concept traits_describe = requires(layer_description& d) { layer_traits<L>::template describe<In>(d); };
template <class L, class In>
concept member_describe = requires(layer_description& d) { L::template describe<In>(d); };
template <class L>
concept traits_onnx = requires(onnx_graph& g, const layer_description& d, const std::string& x) {
  { layer_traits<L>::onnx(g, d, x) } -> std::convertible_to<std::string>;
};
template <class L>
concept member_onnx = requires(onnx_graph& g, const layer_description& d, const std::string& x) {
  { L::onnx(g, d, x) } -> std::convertible_to<std::string>;
};
template <class L, class In, class Backend>
concept traits_footprint = requires(const footprint_context& c) {
  { layer_traits<L>::template footprint<In, Backend>(c) } -> std::same_as<sequence_elements>;
};
template <class L, class In, class Backend>
concept member_footprint = requires(const footprint_context& c) {
  { L::template footprint<In, Backend>(c) } -> std::same_as<sequence_elements>;
};
template <class L, class In, class Backend>
concept traits_layout = requires { { layer_traits<L>::template layout<In, Backend> } -> std::convertible_to<layout_effect>; };
template <class L, class In, class Backend>
concept member_layout = requires { { L::template layout<In, Backend> } -> std::convertible_to<layout_effect>; };

template <class L, class In>
inline constexpr bool describes_itself = (traits_describe<L, In> && traits_onnx<L>) ||
                                         (member_describe<L, In> && member_onnx<L>);

/// Layer L's description on input In, its text and tensors (d's path and shapes are set).
template <class L, class In>
void describe_layer(layer_description& d) {
  if constexpr (traits_describe<L, In> && traits_onnx<L>) {
    layer_traits<L>::template describe<In>(d);
  } else if constexpr (member_describe<L, In> && member_onnx<L>) {
    L::template describe<In>(d);
  } else {
    static_assert(describes_itself<L, In>,
                  "loom cannot save, checkpoint or export a layer of this network: it does not describe itself. Give "
                  "it `template <class In> static void describe(loom::layer_description&)` and `static std::string "
                  "onnx(loom::onnx_graph&, const loom::layer_description&, const std::string&)`, or specialise "
                  "loom::layer_traits<Layer> with them (docs/layers.md, \"Writing your own layer\"; the layer is in "
                  "the loom::diagnostic:: name the compiler prints)");
    [[maybe_unused]] constexpr bool reported = fail_with<diagnostic::layer_does_not_describe_itself<L>>();
  }
}

/// Layer L's ONNX export, from the same place as its description (its traits or its members).
template <class L, class In>
constexpr onnx_function onnx_of() {
  if constexpr (traits_describe<L, In> && traits_onnx<L>) return &layer_traits<L>::onnx;
  else if constexpr (member_describe<L, In> && member_onnx<L>) return &L::onnx;
  else return nullptr;  // describe_layer has said why
}

/// What layer L holds itself on input In on Backend, in context c (its output aside): its
/// footprint(), or nothing.
template <class L, class In, class Backend>
constexpr sequence_elements footprint_of(const footprint_context& c) {
  if constexpr (traits_footprint<L, In, Backend>) return layer_traits<L>::template footprint<In, Backend>(c);
  else if constexpr (member_footprint<L, In, Backend>) return L::template footprint<In, Backend>(c);
  else return {};
}

/// Layer L's layout effect on input In on Backend: its layout, or plain (a forward that leaves
/// y.format as it is constructed writes plain row-major data).
template <class L, class In, class Backend>
constexpr layout_effect layout_of() {
  if constexpr (traits_layout<L, In, Backend>) return layer_traits<L>::template layout<In, Backend>;
  else if constexpr (member_layout<L, In, Backend>) return L::template layout<In, Backend>;
  else return layout_effect::plain;
}

/// Every tensor of layers (and of their inner layers), in order.
LOOM_DECL void collect(const std::vector<layer_description>& layers, std::vector<tensor_description>& out);

/// Adds `by` to the offsets of every parameter tensor of layers and of their inner layers, and
/// `buffers_by` to those of every buffer tensor (a branch laid out after another).
LOOM_DECL void shift(std::vector<layer_description>& layers, std::size_t by, std::size_t buffers_by);

/// Where a layer of a chain sits: its path element (its name when it has one, loom::named, else
/// its index) and its span of the chain's parameters and of its buffers.
struct chain_slot {
  std::size_t index = 0;
  std::string_view name;  // empty: the index names it
  std::size_t parameters = 0, at = 0;
  std::size_t buffers = 0, buffer_at = 0;
};

/// Describes one layer of a chain in compiled code: its path (prefix + its name or index), one
/// sample's shapes in and out, then `describe` (the layer's) fills the text and tensors; a named
/// layer's text is "name:text". Checks that the tensors (and the inner layers') hold the slot's
/// parameters and buffers, makes their offsets the chain's, and appends it to out. The templates
/// only hand over their compile-time facts.
/// Throws: loom::error naming the layer when its describe() is wrong.
LOOM_DECL void describe_into(const std::string& prefix, const chain_slot& slot, const std::size_t* in,
                             std::size_t in_rank, const std::size_t* out_dims, std::size_t out_rank,
                             void (*describe)(layer_description&), onnx_function onnx,
                             std::vector<layer_description>& out);

}  // namespace detail

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/describe.ipp"
#endif
