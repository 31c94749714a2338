// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of onnx.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/io/onnx.hpp"

namespace loom::io {
namespace detail {

LOOM_DECL std::string onnx_raw(std::span<const float> values, onnx_precision p) {
  std::string raw(values.size() * onnx_type_bytes(p), '\0');
  if (p == onnx_precision::fp32) {
    if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());
    return raw;
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint16_t b = p == onnx_precision::fp16 ? fp16_bits(values[i]) : ::loom::detail::bf16_bits(values[i]);
    raw[2 * i] = static_cast<char>(b & 0xff), raw[2 * i + 1] = static_cast<char>(b >> 8);
  }
  return raw;
}

LOOM_DECL protobuf::message onnx_attribute_proto(const onnx_attribute& a) {
  protobuf::message m;
  m.bytes(1, a.name);
  switch (a.kind) {
    case onnx_attribute::type::integer: m.varint(20, attr_int).varint(3, a.integer); break;
    case onnx_attribute::type::real: m.varint(20, attr_float).fixed32(2, a.real); break;
    case onnx_attribute::type::integers:
      m.varint(20, attr_ints);
      for (std::size_t i = 0; i < a.integer_count; ++i) m.varint(8, a.integers[i]);
      break;
  }
  return m;
}

LOOM_DECL protobuf::message onnx_tensor(std::string_view name, const std::vector<std::size_t>& dims, int type,
                                        std::string_view raw) {
  protobuf::message t;
  for (auto d : dims) t.varint(1, static_cast<std::int64_t>(d));
  t.varint(2, type);
  if (!name.empty()) t.bytes(8, name);
  t.bytes(9, raw);
  return t;
}

LOOM_DECL protobuf::message onnx_value_info(std::string_view name, int type, std::string_view batch,
                                            const std::vector<std::size_t>& sample) {
  protobuf::message shape;
  shape.nested(1, protobuf::message{}.bytes(2, batch));
  for (auto d : sample) shape.nested(1, protobuf::message{}.varint(1, static_cast<std::int64_t>(d)));
  protobuf::message tensor;
  tensor.varint(1, type).nested(2, shape);
  protobuf::message vi;
  vi.bytes(1, name).nested(2, protobuf::message{}.nested(1, tensor));
  return vi;
}

LOOM_DECL std::string onnx_graph_builder::add(std::string_view op, std::vector<std::string> inputs,
                                              std::vector<protobuf::message> attrs) {
  std::string base = "/";
  for (char c : path_) base += c == '.' ? '/' : c;
  if (!path_.empty()) base += '/';
  base += op;
  const int n = used_[base]++;
  node x{std::string(op), n ? base + "_" + std::to_string(n) : base, std::move(inputs), {}, std::move(attrs)};
  x.outputs.push_back(x.name + "_output_0");
  nodes_.push_back(std::move(x));
  return nodes_.back().outputs[0];
}

LOOM_DECL std::vector<protobuf::message> onnx_graph_builder::encoded(std::initializer_list<onnx_attribute> attributes) {
  std::vector<protobuf::message> attrs;
  attrs.reserve(attributes.size());
  for (const auto& a : attributes) attrs.push_back(onnx_attribute_proto(a));
  return attrs;
}

LOOM_DECL std::string onnx_graph_builder::add_node(std::string_view op, std::initializer_list<std::string_view> inputs,
                                                   std::initializer_list<onnx_attribute> attributes) {
  return add(op, std::vector<std::string>(inputs.begin(), inputs.end()), encoded(attributes));
}

LOOM_DECL std::string onnx_graph_builder::add_float_node(std::string_view op,
                                                         std::initializer_list<std::string_view> inputs,
                                                         std::initializer_list<onnx_attribute> attributes) {
  std::vector<std::string> in;
  in.reserve(inputs.size());
  for (std::string_view v : inputs) in.push_back(in_float(std::string(v)));
  return in_float(add(op, std::move(in), encoded(attributes)), /*back=*/true);
}

LOOM_DECL std::string onnx_graph_builder::constant(float v) {
  const float one[1] = {v};
  protobuf::message a;
  a.bytes(1, "value").varint(20, attr_tensor).nested(5, onnx_tensor("", {}, onnx_type(o_.precision), onnx_raw(one, o_.precision)));
  std::vector<protobuf::message> attrs;
  attrs.push_back(std::move(a));
  return add("Constant", {}, std::move(attrs));
}

LOOM_DECL std::string onnx_graph_builder::in_float(const std::string& v, bool back) {
  if (o_.precision != onnx_precision::bf16) return v;
  return add_node("Cast", {v}, {onnx_attr("to", back ? onnx_bfloat16 : onnx_float)});
}

LOOM_DECL std::string_view onnx_graph_builder::initializer(const tensor_description& t) {
  const std::span<const float> from = t.kind == tensor_kind::buffer ? buffers_ : params_;
  inits_.push_back({t.name, t.shape, onnx_raw(from.subspan(t.offset, t.count), o_.precision)});
  return t.name;
}

LOOM_DECL std::string onnx_graph_builder::layers(const std::vector<layer_description>& ls, const std::string& x) {
  const std::string outer = path_;
  std::string y = x;
  for (const auto& l : ls) {
    if (!l.onnx)
      throw error("loom::export_onnx: layer " + l.path + " (" + l.text + ") has no ONNX export: its description "
                  "was not made by loom::io::describe");
    path_ = l.path;
    y = l.onnx(*this, l, y);
  }
  path_ = outer;
  return y;
}

LOOM_DECL void onnx_graph_builder::rename_output(const std::string& from, const std::string& to) {
  for (auto& n : nodes_)
    for (auto& o : n.outputs)
      if (o == from) o = to;
}

LOOM_DECL bool onnx_external(std::uint64_t weight_bytes, onnx_external_data mode, const std::filesystem::path& path) {
  const bool too_large = weight_bytes > onnx_inline_limit;
  if (mode == onnx_external_data::never && too_large)
    throw invalid_argument("loom::export_onnx(" + path.string() + "): the weights take " + std::to_string(weight_bytes) +
                           " bytes, more than one ONNX protobuf holds (2 GiB): use onnx_external_data::automatic or "
                           "always");
  return mode == onnx_external_data::always || too_large;
}

LOOM_DECL std::filesystem::path external_data_path(const std::filesystem::path& model) {
  return model.parent_path() / (model.filename().string() + ".data");
}

LOOM_DECL std::string onnx_model(const network_description& d, std::span<const float> params,
                                 std::span<const float> buffers, const onnx_options& o, bool external, std::string* data,
                                 const std::string& data_name) {
  onnx_graph_builder g(params, buffers, o);
  const int type = onnx_type(o.precision);
  std::string x = "input";
  if (type != onnx_float) x = g.add_node("Cast", {x}, {onnx_attr("to", type)});
  x = g.layers(d.layers, x);
  if (o.softmax) x = g.add_node("Softmax", {x}, {onnx_attr("axis", 1)});
  if (type != onnx_float) x = g.add_node("Cast", {x}, {onnx_attr("to", onnx_float)});
  if (x == "input") x = g.add_node("Identity", {x});  // a network of dropout alone
  g.rename_output(x, "output");

  protobuf::message graph;
  for (const auto& n : g.nodes()) {
    protobuf::message m;
    for (const auto& i : n.inputs) m.bytes(1, i);
    for (const auto& out : n.outputs) m.bytes(2, out);
    m.bytes(3, n.name).bytes(4, n.op);
    for (const auto& a : n.attrs) m.nested(5, a);
    graph.nested(1, m);
  }
  graph.bytes(2, "loom");
  for (const auto& i : g.initializers()) {
    if (!external) {
      graph.nested(5, onnx_tensor(i.name, i.dims, type, i.raw));
      continue;
    }
    data->append((onnx_external_alignment - data->size() % onnx_external_alignment) % onnx_external_alignment, '\0');
    const std::size_t offset = data->size();
    data->append(i.raw);
    protobuf::message t;
    for (auto dim : i.dims) t.varint(1, static_cast<std::int64_t>(dim));
    t.varint(2, type).bytes(8, i.name);
    auto entry = [](std::string_view k, std::string_view v) {
      protobuf::message e;
      e.bytes(1, k).bytes(2, v);
      return e;
    };
    t.nested(13, entry("location", data_name));
    t.nested(13, entry("offset", std::to_string(offset)));
    t.nested(13, entry("length", std::to_string(i.raw.size())));
    t.varint(14, 1);  // DataLocation EXTERNAL
    graph.nested(5, t);
  }
  graph.nested(11, onnx_value_info("input", onnx_float, o.batch_name, d.input_shape));
  graph.nested(12, onnx_value_info("output", onnx_float, o.batch_name, d.output_shape));

  protobuf::message model;
  model.varint(1, 8);  // IR version 8
  model.bytes(2, "loom").bytes(3, "0.1.0");
  model.nested(7, graph);
  model.nested(8, protobuf::message{}.bytes(1, "").varint(2, 17));  // opset 17 of the default domain
  auto prop = [&](std::string_view k, const std::string& v) { model.nested(14, protobuf::message{}.bytes(1, k).bytes(2, v)); };
  prop("loom.network", d.text());
  prop("loom.fingerprint", d.fingerprint());
  return model.encoded();
}

LOOM_DECL void export_onnx_described(const network_description& d, std::size_t parameters,
                                     std::span<const float> params, std::size_t buffers,
                                     std::span<const float> buffer_values, const std::filesystem::path& path,
                                     const onnx_options& options) {
  if (params.size() != parameters)
    throw invalid_argument("loom::export_onnx(" + path.string() + "): the network has " +
                           std::to_string(parameters) + " parameters but " +
                           std::to_string(params.size()) + " values were given");
  if (buffer_values.size() != buffers)
    throw invalid_argument("loom::export_onnx(" + path.string() + "): the network holds " + std::to_string(buffers) +
                           " buffer values (running statistics) but " + std::to_string(buffer_values.size()) +
                           " were given");
  const bool external = onnx_external(
      std::uint64_t{parameters + buffers} * onnx_type_bytes(options.precision), options.external_data, path);
  const auto data_path = external_data_path(path);
  std::string data;
  const std::string model =
      onnx_model(d, params, buffer_values, options, external, &data, data_path.filename().string());
  if (external) {
    atomic_file out(data_path);
    out.write(data);
    out.commit();
  }
  atomic_file out(path);
  out.write(model);
  out.commit();
  // The model is whole; a data file left by an earlier external export of it is now stale.
  if (!external) {
    std::error_code ec;
    std::filesystem::remove(data_path, ec);
  }
}
}  // namespace detail

}  // namespace loom::io
