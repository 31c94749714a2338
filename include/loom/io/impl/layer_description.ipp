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

}  // namespace detail

LOOM_DECL std::string network_description::text() const {
  return "network<input<" + detail::join(input_shape) + ">," + joined_text(layers) + ">";
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
  ::loom::detail::collect(layers, out);
  return out;
}

}  // namespace loom::io
