// SPDX-License-Identifier: Apache-2.0
#pragma once
// A minimal type list with the few metafunctions loom needs (Boost.Mp11 rhythm: a signature
// comment, a detail:: implementation, one public alias).

#include <cstddef>
#include <type_traits>

namespace loom {

template <class... T>
struct type_list {
  static constexpr std::size_t size = sizeof...(T);
};

namespace detail {
template <std::size_t I, class L>
struct at_impl;
template <std::size_t I, class H, class... T>
struct at_impl<I, type_list<H, T...>> : at_impl<I - 1, type_list<T...>> {};
template <class H, class... T>
struct at_impl<0, type_list<H, T...>> {
  using type = H;
};
}  // namespace detail

// at<I, type_list<T...>> -> the I-th type
template <std::size_t I, class L>
using at = typename detail::at_impl<I, L>::type;

}  // namespace loom
