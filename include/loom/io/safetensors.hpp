// SPDX-License-Identifier: Apache-2.0
#pragma once
// A network's weights as one safetensors file: an 8-byte little-endian header length, a JSON
// header (each tensor's dtype, shape and data_offsets, and a __metadata__ object with loom's
// network text and fingerprint), then the raw little-endian values. The names and shapes are
// the ones torch.nn.Sequential of the same layers has ("3.weight", linear (out, in), conv2d
// (out, in, kh, kw)), so PyTorch loads the file with load_state_dict(strict=True): each layer's
// parameters and then its buffers (batch norm's running statistics; num_batches_tracked as
// int64, as PyTorch holds it), in the network's order. Weights only: no optimizer or trainer
// state.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/io/file.hpp"
#include "loom/io/json.hpp"
#include "loom/io/layer_description.hpp"

namespace loom::io {

static_assert(std::endian::native == std::endian::little,
              "loom::io writes and reads safetensors' little-endian values as they lie in memory: a little-endian "
              "host is needed");

/// One tensor to write: its name, shape and values (row-major); an int64 one (a count held in
/// T: batch norm's num_batches_tracked) is written as int64 ("I64"), as PyTorch holds it.
template <class T>
struct named_tensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::span<const T> values;
  bool int64 = false;
};

namespace detail {
template <class T>
constexpr const char* safetensors_dtype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "loom::io's safetensors files hold float (F32) or double (F64) values");
  return std::is_same_v<T, float> ? "F32" : "F64";
}

LOOM_DECL std::size_t dtype_bytes(std::string_view d);

LOOM_DECL std::string shape_text(const std::vector<std::size_t>& s);

/// The largest header the reader accepts (safetensors' own limit).
inline constexpr std::uint64_t max_header_bytes = 100u << 20;
}  // namespace detail

/// Writes tensors as the safetensors file `path`, crash-safe (io/file.hpp's atomic_file): a
/// failed write leaves no file, and an existing one as it was. metadata goes into
/// __metadata__. The tensors are laid out in the order given.
/// Throws: loom::io_error naming the file; loom::invalid_argument when a tensor's values do
/// not match its shape or a name repeats.
template <class T>
void write_safetensors(const std::filesystem::path& path, std::span<const named_tensor<T>> tensors,
                       const std::map<std::string, std::string>& metadata = {}) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) header += (first ? "" : ",") + json::quote(k) + ":" + json::quote(v), first = false;
    header += "}";
  }
  std::uint64_t at = 0;
  std::map<std::string_view, int> seen;
  for (const auto& t : tensors) {
    std::size_t n = 1;
    for (auto e : t.shape) n *= e;
    if (n != t.values.size())
      throw invalid_argument("loom::io::write_safetensors(" + path.string() + "): tensor " + t.name + " has shape " +
                             detail::shape_text(t.shape) + " (" + std::to_string(n) + " values) but " +
                             std::to_string(t.values.size()) + " values were given");
    if (t.name == "__metadata__" || seen[t.name]++)
      throw invalid_argument("loom::io::write_safetensors(" + path.string() + "): the tensor name " + t.name +
                             " is reserved or given twice");
    const std::uint64_t end = at + n * (t.int64 ? sizeof(std::int64_t) : sizeof(T));
    header += std::string(header.size() > 1 ? "," : "") + json::quote(t.name) + ":{\"dtype\":\"" +
              (t.int64 ? "I64" : detail::safetensors_dtype<T>()) + "\",\"shape\":[" + detail::join(t.shape) +
              "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(end) + "]}";
    at = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as safetensors writes it
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  atomic_file out(path);
  out.write(len, 8);
  out.write(header);
  for (const auto& t : tensors) {
    if (!t.int64) {
      out.write(t.values.data(), t.values.size_bytes());
      continue;
    }
    std::vector<std::int64_t> v(t.values.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(t.values[i]);
    out.write(v.data(), v.size() * sizeof(std::int64_t));
  }
  out.commit();
}
LOOM_INSTANTIATE(void write_safetensors<float>(const std::filesystem::path&, std::span<const named_tensor<float>>,
                                                const std::map<std::string, std::string>&))

/// A safetensors file opened for reading, its header checked: valid JSON, every tensor with a
/// known dtype, a shape and data_offsets that agree with each other, tensors that tile the
/// data section exactly, and a file long enough for all of them.
/// Throws (constructor): loom::io_error naming the file, the tensor or field, what was
/// expected and what was found.
class safetensors_file {
 public:
  struct entry {
    std::string name, dtype;
    std::vector<std::size_t> shape;
    std::uint64_t begin = 0, end = 0;  // in the data section
  };

  explicit safetensors_file(std::filesystem::path path);

  const std::filesystem::path& path() const noexcept { return file_.path(); }
  const std::vector<entry>& tensors() const noexcept { return entries_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// The tensor named name, or null.
  const entry* find(std::string_view name) const noexcept {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  /// Reads e's raw bytes (e.end - e.begin of them) into dst.
  void read(const entry& e, void* dst) const;

 private:
  input_file file_;
  std::uint64_t data_at_ = 0;
  std::vector<entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// The __metadata__ loom writes: the network as text, its fingerprint and parameter count, and
/// "format": "pt" (what Hugging Face's loaders look for).
LOOM_DECL std::map<std::string, std::string> weights_metadata(const network_description& d);

/// The parameters and buffers of a network, as host vectors in its flat layouts (what
/// load_weights_and_buffers reads).
template <class T>
struct model_weights {
  std::vector<T> parameters;
  std::vector<T> buffers;
};

namespace detail {
/// save_weights and load_weights for the network d of `parameters` parameters and `buffers`
/// buffer values: the work of both, whatever the network (loom::compiled holds them for float).
template <class T>
void save_weights_described(const network_description& d, std::size_t parameters, std::span<const T> params,
                            std::size_t buffers, std::span<const T> buffer_values, const std::filesystem::path& path) {
  if (params.size() != parameters)
    throw invalid_argument("loom::save_weights(" + path.string() + "): the network has " +
                           std::to_string(parameters) + " parameters but " +
                           std::to_string(params.size()) + " values were given");
  if (buffer_values.size() != buffers)
    throw invalid_argument("loom::save_weights(" + path.string() + "): the network holds " + std::to_string(buffers) +
                           " buffer values (running statistics) but " + std::to_string(buffer_values.size()) +
                           " were given");
  std::vector<named_tensor<T>> tensors;
  for (const auto& t : d.tensors()) {
    const std::span<const T> from = t.kind == tensor_kind::buffer ? buffer_values : params;
    tensors.push_back({t.name, t.shape, from.subspan(t.offset, t.count), t.element == tensor_element::int64});
  }
  io::write_safetensors<T>(path, tensors, weights_metadata(d));
}
template <class T>
model_weights<T> load_weights_described(const network_description& d, std::size_t parameters, std::size_t buffers,
                                        const std::filesystem::path& path) {
  const safetensors_file file(path);
  const std::string f = path.string();
  if (auto it = file.metadata().find("loom.network"); it != file.metadata().end() && it->second != d.text())
    throw io_error(f + " holds the weights of " + it->second + ", not of this model's " + d.text());
  const auto expected = d.tensors();
  std::vector<std::string> missing, unexpected, prefixed;
  for (const auto& t : expected)
    if (!file.find(t.name)) missing.push_back(t.name + " " + shape_text(t.shape));
  for (const auto& e : file.tensors()) {
    bool known = false;
    for (const auto& t : expected) known = known || t.name == e.name;
    if (known) continue;
    unexpected.push_back(e.name + " " + shape_text(e.shape));
    if (e.name.starts_with("module.")) prefixed.push_back(e.name);
  }
  if (!missing.empty() || !unexpected.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
      return s;
    };
    std::string msg = f + " does not hold this model's tensors:";
    if (!missing.empty()) msg += " missing " + list(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected " + list(unexpected) + ";";
    if (!prefixed.empty() && prefixed.size() == unexpected.size())
      msg += " its names carry a stray \"module.\" prefix (saved from a DistributedDataParallel or DataParallel "
             "wrapper): save model.module.state_dict() instead, or strip the prefix;";
    msg += " expected " + std::to_string(expected.size()) + " tensors of " + d.text();
    throw io_error(msg);
  }
  model_weights<T> w{std::vector<T>(parameters), std::vector<T>(buffers)};
  for (const auto& t : expected) {
    const auto& e = *file.find(t.name);
    const bool count = t.element == tensor_element::int64;
    const char* want = count ? "I64" : safetensors_dtype<T>();
    if (e.dtype != want)
      throw io_error(f + ": tensor " + t.name + " is " + e.dtype + " but this model reads " + want +
                     (count ? " (a count, as PyTorch's num_batches_tracked: torch.int64)"
                            : " (convert it, e.g. tensor.float(), before saving)"));
    if (e.shape != t.shape)
      throw io_error(f + ": tensor " + t.name + " has shape " + shape_text(e.shape) + " but this model expects " +
                     shape_text(t.shape));
    T* into = (t.kind == tensor_kind::buffer ? w.buffers.data() : w.parameters.data()) + t.offset;
    if (!count) {
      file.read(e, into);
      continue;
    }
    std::vector<std::int64_t> v(t.count);
    file.read(e, v.data());
    for (std::size_t i = 0; i < v.size(); ++i) into[i] = static_cast<T>(v[i]);
  }
  return w;
}
LOOM_INSTANTIATE(void save_weights_described<float>(const network_description&, std::size_t, std::span<const float>,
                                                    std::size_t, std::span<const float>, const std::filesystem::path&))
LOOM_INSTANTIATE(model_weights<float> load_weights_described<float>(const network_description&, std::size_t, std::size_t,
                                                                    const std::filesystem::path&))

/// Says, at compile time, that Network holds buffers that a call without them would lose.
template <class Network>
constexpr void check_no_buffers(const char*) {
  static_assert(Network::buffer_count == 0,
                "this network holds buffers (batch norm's running statistics), which are part of its weights: pass "
                "them too (save_weights<Network>(parameters, buffers, path), load_weights_and_buffers<Network>(path), "
                "export_onnx<Network>(parameters, buffers, path)) or give the loom::model itself");
}
}  // namespace detail

/// Writes the whole flat parameter buffer of Network (Network::parameter_count values in
/// Network's layout, host memory) as the safetensors file `path`, crash-safe. For a network
/// without buffers; one with them (batch norm) passes them too (below).
/// Throws: loom::invalid_argument when params has the wrong size; loom::io_error.
template <class Network, class T>
void save_weights(std::span<const T> params, const std::filesystem::path& path) {
  detail::check_no_buffers<Network>("save_weights");
  detail::save_weights_described<T>(describe<Network>(), Network::parameter_count, params, 0, {}, path);
}

/// The same with the network's buffers (Network::buffer_count values in its flat buffer of
/// buffers: running statistics under their PyTorch names, num_batches_tracked as int64).
template <class Network, class T>
void save_weights(std::span<const T> params, std::span<const T> buffers, const std::filesystem::path& path) {
  detail::save_weights_described<T>(describe<Network>(), Network::parameter_count, params, Network::buffer_count,
                                    buffers, path);
}

/// Reads the safetensors file `path` as Network's flat parameter buffer (host memory). The file
/// must hold exactly Network's tensors, with their names, shapes and dtype (F32 for float); a
/// file that says it was saved from another loom network is refused. For a network without
/// buffers; one with them reads them too (load_weights_and_buffers).
/// Throws: loom::io_error naming the file, the tensor, what was expected and what was found.
template <class Network, class T = float>
std::vector<T> load_weights(const std::filesystem::path& path) {
  detail::check_no_buffers<Network>("load_weights");
  return detail::load_weights_described<T>(describe<Network>(), Network::parameter_count, 0, path).parameters;
}

/// Reads the safetensors file `path` as Network's parameters and buffers (a count such as
/// num_batches_tracked from int64); the checks of load_weights.
template <class Network, class T = float>
model_weights<T> load_weights_and_buffers(const std::filesystem::path& path) {
  return detail::load_weights_described<T>(describe<Network>(), Network::parameter_count, Network::buffer_count, path);
}

/// Writes model's parameters and buffers (a loom::model, any backend) as the safetensors file
/// `path`.
template <class Model>
void save_weights(const Model& model, const std::filesystem::path& path) {
  using T = typename Model::value_type;
  const std::vector<T> host = model.copy_parameters_to_host();
  const std::vector<T> buffers = model.copy_buffers_to_host();
  save_weights<typename Model::network_type, T>(std::span<const T>(host), std::span<const T>(buffers), path);
}

/// Sets model's parameters and buffers from the safetensors file `path`; on any error the model
/// is left as it was.
template <class Model>
void load_weights(Model& model, const std::filesystem::path& path) {
  using T = typename Model::value_type;
  const model_weights<T> w = load_weights_and_buffers<typename Model::network_type, T>(path);
  model.copy_parameters_from_host(w.parameters);
  model.copy_buffers_from_host(w.buffers);
}

}  // namespace loom::io

namespace loom {
using io::load_weights;
using io::load_weights_and_buffers;
using io::model_weights;
using io::save_weights;
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/safetensors.ipp"
#endif
