// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definition of type_name.hpp's parser of __PRETTY_FUNCTION__: included at the end of the
// header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION).

#include "loom/core/type_name.hpp"

namespace loom::detail {

LOOM_DECL std::string type_name_in(std::string_view p) {
  constexpr std::string_view key = "T = ";
  const std::size_t begin = p.find(key);
  if (begin == std::string_view::npos) return std::string(p);
  std::size_t end = begin + key.size();
  // The name ends at the first ';' or ']' outside template brackets.
  for (int depth = 0; end < p.size(); ++end) {
    const char c = p[end];
    if (c == '<' || c == '(' || c == '[') ++depth;
    else if ((c == '>' || c == ')') && depth > 0) --depth;
    else if ((c == ';' || c == ']') && depth == 0) break;
    else if (c == ']') --depth;
  }
  return std::string(p.substr(begin + key.size(), end - begin - key.size()));
}

}  // namespace loom::detail
