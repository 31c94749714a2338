// SPDX-License-Identifier: Apache-2.0
#pragma once
// A minimal type list with the few metafunctions loom needs (Boost.Mp11 rhythm: a signature
// comment, a detail:: implementation, one public alias).

#include <cstddef>
#include <type_traits>
#include <utility>

namespace loom {

template <class... T>
struct type_list {
  static constexpr std::size_t size = sizeof...(T);
};

namespace detail {
// One base per element, tagged with its index: looking an index up is overload resolution
// over the bases of one class (instantiated once per list), not a recursion of I steps, so
// reading every element of a list of N costs O(N) instantiations, not O(N^2).
template <std::size_t I, class T>
struct indexed {
  using type = T;
};
template <class Indices, class... T>
struct indexed_list;
template <std::size_t... I, class... T>
struct indexed_list<std::index_sequence<I...>, T...> : indexed<I, T>... {};

template <std::size_t I, class T>
indexed<I, T> pick(const indexed<I, T>&);

template <std::size_t I, class L>
struct at_impl;
template <std::size_t I, class... T>
struct at_impl<I, type_list<T...>> {
  static_assert(I < sizeof...(T), "loom::at<I, type_list<...>>: I is past the end of the list");
  using type = typename decltype(pick<I>(indexed_list<std::index_sequence_for<T...>, T...>{}))::type;
};
}  // namespace detail

// at<I, type_list<T...>> -> the I-th type
template <std::size_t I, class L>
using at = typename detail::at_impl<I, L>::type;

}  // namespace loom
