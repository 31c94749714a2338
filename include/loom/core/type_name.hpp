// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::type_name<T>(): a type as the compiler spells it in source form
// (`loom::network<loom::input<1, 28, 28>, loom::linear<10, ...>>`), for messages that must name a
// type a person wrote — never the mangled typeid name. g++ and nvcc (whose host compiler is
// g++) spell it in __PRETTY_FUNCTION__; default template arguments appear spelled out.

#include <string>
#include <string_view>

#include "loom/core/config.hpp"

namespace loom {

namespace detail {
template <class T>
constexpr std::string_view pretty_function_of() {
  return __PRETTY_FUNCTION__;  // "... pretty_function_of() [with T = X; ...]" or "[with T = X]"
}

/// The type name inside a __PRETTY_FUNCTION__ of pretty_function_of<T>: from "T = " to the
/// first ';' or ']' outside brackets (all of it when there is no "T = "). Compiled once (the
/// templates below only hand over their string), so naming a type costs no code per type.
LOOM_DECL std::string type_name_in(std::string_view pretty);
}  // namespace detail

/// T's name in source form, without cv or reference changes. Requires: a GCC-compatible compiler.
template <class T>
std::string type_name() {
  return detail::type_name_in(detail::pretty_function_of<T>());
}

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/core/impl/type_name.ipp"
#endif
