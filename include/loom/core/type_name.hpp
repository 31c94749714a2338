// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::type_name<T>(): a type as the compiler spells it in source form
// (`loom::network<loom::input<1, 28, 28>, loom::linear<10, ...>>`), for messages that must name a
// type a person wrote — never the mangled typeid name. g++ and nvcc (whose host compiler is
// g++) spell it in __PRETTY_FUNCTION__; default template arguments appear spelled out.

#include <string>
#include <string_view>

namespace loom {

namespace detail {
template <class T>
constexpr std::string_view pretty_function_of() {
  return __PRETTY_FUNCTION__;  // "... pretty_function_of() [with T = X; ...]" or "[with T = X]"
}
}  // namespace detail

/// T's name in source form, without cv or reference changes. Requires: a GCC-compatible compiler.
template <class T>
std::string type_name() {
  const std::string_view p = detail::pretty_function_of<T>();
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

}  // namespace loom
