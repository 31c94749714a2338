// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of safetensors.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/io/safetensors.hpp"

namespace loom::io {
namespace detail {

LOOM_DECL std::size_t dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

LOOM_DECL std::string shape_text(const std::vector<std::size_t>& s) {
  std::string t = "(";  // appended: g++ 12 warns falsely (-Wrestrict) on "(" + std::string&&
  t += join(s, ", ");
  t += ')';
  return t;
}
}  // namespace detail
}  // namespace loom::io

namespace loom::io {

LOOM_DECL safetensors_file::safetensors_file(std::filesystem::path path) : file_(std::move(path)) {
  const std::string f = file_.path().string();
  if (file_.size() < 8)
    throw io_error(f + " is truncated: " + std::to_string(file_.size()) +
                   " bytes, too short for safetensors' 8-byte header length");
  unsigned char len[8];
  file_.read_at(0, len, 8, "the header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > detail::max_header_bytes)
    throw io_error(f + " is not a safetensors file: its header length is " + std::to_string(n) + " bytes, over the " +
                   std::to_string(detail::max_header_bytes) + " a header may have");
  if (8 + n > file_.size())
    throw io_error(f + " is truncated: its header length " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(file_.size()) + " bytes)");
  std::string text(n, '\0');
  file_.read_at(8, text.data(), n, "the header");
  data_at_ = 8 + n;
  const std::uint64_t data_bytes = file_.size() - data_at_;
  json::value h;
  try {
    h = json::parse(text);
  } catch (const json::parse_error& e) {
    throw io_error(f + ": the safetensors header is not valid JSON (" + e.what() + ")");
  }
  if (!h.is_object()) throw io_error(f + ": the safetensors header is not a JSON object");
  for (const auto& [name, v] : h.members) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw io_error(f + ": __metadata__ is not an object of strings");
      for (const auto& [k, s] : v.members) {
        if (!s.is_string()) throw io_error(f + ": __metadata__ entry " + k + " is not a string");
        metadata_[k] = s.text;
      }
      continue;
    }
    const std::string where = f + ": tensor " + name;
    if (find(name)) throw io_error(where + " appears twice in the header");
    if (!v.is_object()) throw io_error(where + " is not described by an object");
    entry e;
    e.name = name;
    const json::value* dtype = v.find("dtype");
    if (!dtype || !dtype->is_string()) throw io_error(where + " has no dtype string");
    e.dtype = dtype->text;
    const std::size_t elem = detail::dtype_bytes(e.dtype);
    if (!elem) throw io_error(where + " has an unknown dtype \"" + e.dtype + "\"");
    const json::value* shape = v.find("shape");
    if (!shape || !shape->is_array()) throw io_error(where + " has no shape array");
    std::uint64_t count = 1;
    for (const auto& d : shape->items) {
      std::uint64_t x;
      if (!d.to_u64(x)) throw io_error(where + " has a shape entry that is not a non-negative integer");
      if (x && count > ~std::uint64_t{0} / x / elem) throw io_error(where + " has a shape too large to hold");
      e.shape.push_back(static_cast<std::size_t>(x));
      count *= x;
    }
    const json::value* off = v.find("data_offsets");
    if (!off || !off->is_array() || off->items.size() != 2 || !off->items[0].to_u64(e.begin) ||
        !off->items[1].to_u64(e.end) || e.begin > e.end)
      throw io_error(where + " needs data_offsets [begin, end] with begin <= end");
    if (e.end - e.begin != count * elem)
      throw io_error(where + " is " + e.dtype + " of shape " + detail::shape_text(e.shape) + ", " +
                     std::to_string(count * elem) + " bytes, but its data_offsets span " +
                     std::to_string(e.end - e.begin));
    if (e.end > data_bytes)
      throw io_error(f + " is truncated: tensor " + name + " ends at byte " + std::to_string(e.end) +
                     " of the data, which has " + std::to_string(data_bytes) + " bytes");
    entries_.push_back(std::move(e));
  }
  // The tensors tile the data section: no gaps, no overlaps, nothing after the last.
  std::vector<const entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const entry* a, const entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  for (const entry* e : order) {
    if (e->begin != at)
      throw io_error(f + ": tensor " + e->name + " starts at byte " + std::to_string(e->begin) + " of the data, but " +
                     (e->begin < at ? "the tensor before it ends at byte " : "the data before it ends at byte ") +
                     std::to_string(at) + (e->begin < at ? " (they overlap)" : " (a gap)"));
    at = e->end;
  }
  if (at != data_bytes)
    throw io_error(f + " has " + std::to_string(data_bytes - at) + " bytes after its last tensor (data section of " +
                   std::to_string(data_bytes) + " bytes, tensors cover " + std::to_string(at) + ")");
}

LOOM_DECL void safetensors_file::read(const entry& e, void* dst) const {
  file_.read_at(data_at_ + e.begin, dst, e.end - e.begin, "tensor " + e.name);
}

LOOM_DECL std::map<std::string, std::string> weights_metadata(const network_description& d) {
  return {{"format", "pt"},
          {"loom.network", d.text()},
          {"loom.fingerprint", d.fingerprint()},
          {"loom.parameters", std::to_string(d.parameter_count)}};
}
}  // namespace loom::io
