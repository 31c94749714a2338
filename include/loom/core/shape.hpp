// SPDX-License-Identifier: Apache-2.0
#pragma once
// Compile-time per-sample shapes. The batch is the one extent known only at run time, so it
// is never part of a shape: shape<1, 28, 28> is one image; a batch of them is (batch, 1, 28, 28).

#include <array>
#include <cstddef>
#include <string>

#include "loom/core/config.hpp"

namespace loom {

/// The extents of one sample, outermost first: shape<784>, shape<channels, height, width>.
template <std::size_t... D>
struct shape {
  static_assert(sizeof...(D) > 0, "loom::shape needs at least one extent");
  static_assert(((D > 0) && ...), "loom::shape extents must be positive");
  static constexpr std::size_t rank = sizeof...(D);
  static constexpr std::size_t size = (D * ...);
  static constexpr std::array<std::size_t, rank> dims{D...};
  /// Extent I, outermost first.
  template <std::size_t I>
  static constexpr std::size_t dim = dims[I];
};

template <class T>
inline constexpr bool is_shape_v = false;
template <std::size_t... D>
inline constexpr bool is_shape_v<shape<D...>> = true;

/// Any loom::shape<...>.
template <class T>
concept shape_type = is_shape_v<T>;

/// "(1, 28, 28)" — for run-time messages.
template <shape_type S>
std::string to_string() {
  std::string out = "(";
  for (std::size_t i = 0; i < S::rank; ++i) {
    if (i) out += ", ";
    out += std::to_string(S::dims[i]);
  }
  return out + ")";
}

}  // namespace loom
