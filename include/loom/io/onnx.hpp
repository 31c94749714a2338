// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::export_onnx: a trained network as an ONNX model (opset 17, IR version 8) for ONNX
// Runtime and TensorRT, with a symbolic batch dimension. Each layer adds its own nodes through
// loom::onnx_graph (loom/layers/describe.hpp; loom's map to Conv, Gemm (transB=1), Relu,
// LeakyRelu, Tanh, Sigmoid, GELU in its Erf form, MaxPool, AveragePool, Flatten(axis=1),
// LayerNormalization over the whole sample, BatchNormalization with the running statistics,
// GlobalAveragePool, Add around a residual's inner graph; dropout adds none), which this file
// implements. Initializers carry the safetensors names ("3.weight"). The
// file is encoded by io/protobuf.hpp (no libprotobuf) and written crash-safe (io/file.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/io/file.hpp"
#include "loom/io/layer_description.hpp"
#include "loom/io/protobuf.hpp"

namespace loom::io {

/// The element type of the exported weights and of the graph's arithmetic. With fp16 or bf16 the
/// graph's input and output stay float32 and Cast nodes convert at both ends, so callers feed
/// and read float32 either way (TensorRT 10 takes each layer's precision from these types).
/// bf16: opset 17 has no bf16 Conv, MaxPool or AveragePool, so those run in float32 on the
/// bf16-rounded weights and activations (Cast nodes around them); everything else runs in bf16.
enum class onnx_precision { fp32, fp16, bf16 };

/// When the weights go to a file of their own beside the model (`<model file>.data`, ONNX's
/// external data): when the model would not fit in one protobuf (2 GiB), always, or never.
enum class onnx_external_data { automatic, always, never };

/// Options of export_onnx.
struct onnx_options {
  onnx_precision precision = onnx_precision::fp32;
  /// End with Softmax over the classes, so the model outputs probabilities instead of logits.
  bool softmax = false;
  onnx_external_data external_data = onnx_external_data::automatic;
  /// The name of the symbolic batch dimension of the input and output.
  std::string batch_name = "batch";
};

namespace detail {

/// IEEE half-precision bits of x, rounded to nearest, ties to even (overflow to infinity).
inline std::uint16_t fp16_bits(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t exp = (u >> 23) & 0xffu;
  std::uint32_t mant = u & 0x7fffffu;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right, up to infinity
  return static_cast<std::uint16_t>(sign | h);
}

// onnx.proto: TensorProto.DataType and AttributeProto.AttributeType values.
inline constexpr int onnx_float = 1, onnx_float16 = 10, onnx_bfloat16 = 16;
inline constexpr int attr_float = 1, attr_int = 2, attr_tensor = 4, attr_ints = 7;
/// Weights over this many bytes do not fit beside the graph in one protobuf (2 GiB less room
/// for the nodes): automatic external data starts here.
inline constexpr std::uint64_t onnx_inline_limit = (std::uint64_t{1} << 31) - (std::uint64_t{1} << 24);
/// External tensors start at multiples of this (a page), so readers can map them.
inline constexpr std::uint64_t onnx_external_alignment = 4096;

inline int onnx_type(onnx_precision p) {
  return p == onnx_precision::fp16 ? onnx_float16 : p == onnx_precision::bf16 ? onnx_bfloat16 : onnx_float;
}
inline std::size_t onnx_type_bytes(onnx_precision p) { return p == onnx_precision::fp32 ? 4 : 2; }

/// values converted to the precision's element type, as little-endian bytes.
LOOM_DECL std::string onnx_raw(std::span<const float> values, onnx_precision p);

/// An AttributeProto.
LOOM_DECL protobuf::message onnx_attribute_proto(const onnx_attribute& a);

/// A TensorProto with its data inline.
LOOM_DECL protobuf::message onnx_tensor(std::string_view name, const std::vector<std::size_t>& dims, int type,
                                        std::string_view raw);

/// A ValueInfoProto of a tensor whose first dimension is the symbolic batch.
LOOM_DECL protobuf::message onnx_value_info(std::string_view name, int type, std::string_view batch,
                                            const std::vector<std::size_t>& sample);

/// The graph being built: nodes in order, then encoded once the output's name is known. Each
/// layer's onnx() adds its nodes through the onnx_graph interface, named after the layer's path
/// ("/3/Gemm", "/6/0/Relu"; a repeated name gets "_1", "_2", ...).
class onnx_graph_builder final : public onnx_graph {
 public:
  onnx_graph_builder(std::span<const float> params, std::span<const float> buffers, const onnx_options& o)
      : params_(params), buffers_(buffers), o_(o) {}

  struct node {
    std::string op, name;
    std::vector<std::string> inputs, outputs;
    std::vector<protobuf::message> attrs;
  };
  struct initializer_data {
    std::string name;
    std::vector<std::size_t> dims;
    std::string raw;
  };

  std::string add_node(std::string_view op, std::initializer_list<std::string_view> inputs,
                       std::initializer_list<onnx_attribute> attributes = {}) override;
  std::string add_float_node(std::string_view op, std::initializer_list<std::string_view> inputs,
                             std::initializer_list<onnx_attribute> attributes = {}) override;
  std::string_view initializer(const tensor_description& t) override;
  std::string constant(float v) override;
  /// Each layer's nodes in turn, named after its path.
  /// Throws: loom::error for a layer without an ONNX export (a description not made by loom).
  std::string layers(const std::vector<layer_description>& ls, const std::string& x) override;

  /// Renames the value `from` (the output of the last node) to `to`.
  void rename_output(const std::string& from, const std::string& to);

  std::vector<node>& nodes() noexcept { return nodes_; }
  std::vector<initializer_data>& initializers() noexcept { return inits_; }

 private:
  /// Adds node op of the current layer, its attributes encoded; returns its output's name.
  std::string add(std::string_view op, std::vector<std::string> inputs, std::vector<protobuf::message> attrs);
  static std::vector<protobuf::message> encoded(std::initializer_list<onnx_attribute> attributes);
  /// Opset 17 defines Conv, MaxPool and AveragePool for float16, float and double only: in a
  /// bf16 export their operands are cast to float (back=false) and their result back to bf16
  /// (back=true). Other precisions: v itself.
  std::string in_float(const std::string& v, bool back = false);

  std::span<const float> params_, buffers_;
  const onnx_options& o_;
  std::vector<node> nodes_;
  std::vector<initializer_data> inits_;
  std::map<std::string, int> used_;
  /// The path of the layer whose nodes are being added ("" for the graph's own Cast, Softmax).
  std::string path_;
};

/// Whether weights of weight_bytes go to external data under `mode`.
/// Throws: loom::invalid_argument for mode never and weights that do not fit inline.
LOOM_DECL bool onnx_external(std::uint64_t weight_bytes, onnx_external_data mode, const std::filesystem::path& path);

LOOM_DECL std::filesystem::path external_data_path(const std::filesystem::path& model);

/// The ONNX model of network d with parameters params and buffers (running statistics).
/// external: the initializers' data go to `data` (appended at aligned offsets, named by
/// data_name) instead of inline.
LOOM_DECL std::string onnx_model(const network_description& d, std::span<const float> params,
                                 std::span<const float> buffers, const onnx_options& o, bool external, std::string* data,
                                 const std::string& data_name);

/// export_onnx<Network> for the network d of `parameters` parameters and `buffers` buffer values
/// (compiled once: loom::compiled).
LOOM_DECL void export_onnx_described(const network_description& d, std::size_t parameters, std::span<const float> params,
                                     std::size_t buffers, std::span<const float> buffer_values,
                                     const std::filesystem::path& path, const onnx_options& options);

}  // namespace detail

/// Writes Network with parameters `params` (Network::parameter_count values, host memory, the
/// flat layout) as the ONNX model `path`; with external data also `<path>.data` beside it.
/// Crash-safe: each file is written whole or not at all (the data file first), and a failed
/// export leaves no new file behind.
/// Throws: loom::io_error when a file cannot be written (the message says why: a directory
/// that does not exist or is not writable, a full disk); loom::invalid_argument for params of
/// the wrong size, or external_data = never for weights over 2 GiB.
template <class Network>
void export_onnx(std::span<const float> params, const std::filesystem::path& path, const onnx_options& options = {}) {
  static_assert(Network::buffer_count == 0,
                "loom::export_onnx: this network holds buffers (batch norm's running statistics), which its graph "
                "reads: pass them too, export_onnx<Network>(parameters, buffers, path), or export the loom::model");
  detail::export_onnx_described(describe<Network>(), Network::parameter_count, params, 0, {}, path, options);
}

/// The same with the network's buffers (Network::buffer_count values: the running statistics
/// its batch norms normalise with at inference).
template <class Network>
void export_onnx(std::span<const float> params, std::span<const float> buffers, const std::filesystem::path& path,
                 const onnx_options& options = {}) {
  detail::export_onnx_described(describe<Network>(), Network::parameter_count, params, Network::buffer_count, buffers,
                                path, options);
}

/// Writes a loom::model (any backend) as the ONNX model `path`; see export_onnx above.
template <class Model>
  requires requires(const Model& m) { m.copy_parameters_to_host(); typename Model::network_type; }
void export_onnx(const Model& model, const std::filesystem::path& path, const onnx_options& options = {}) {
  static_assert(std::is_same_v<typename Model::value_type, float>, "loom::export_onnx exports float models");
  const std::vector<float> host = model.copy_parameters_to_host();
  const std::vector<float> buffers = model.copy_buffers_to_host();
  export_onnx<typename Model::network_type>(std::span<const float>(host), std::span<const float>(buffers), path,
                                            options);
}

}  // namespace loom::io

namespace loom {
using io::export_onnx;
using io::onnx_external_data;
using io::onnx_options;
using io::onnx_precision;
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/onnx.ipp"
#endif
