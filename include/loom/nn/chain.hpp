// SPDX-License-Identifier: Apache-2.0
#pragma once
// Compile-time shape inference over a list of layers: each layer's input and output shape,
// parameter count and offset in the flat buffer. A layer that does not accept its input stops
// the inference there with its own static_assert, so the compiler reports one error, not a
// cascade.

#include <array>
#include <cstddef>
#include <type_traits>

#include "loom/core/shape.hpp"
#include "loom/core/type_list.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

template <class L>
concept loom_layer = requires { requires L::is_loom_layer; };

namespace detail {

template <std::size_t Index, class In, class L>
constexpr bool check_layer() {
  if constexpr (!loom_layer<L>) {
    static_assert(loom_layer<L>,
                  "loom::network: a type in the layer list is not a loom layer (loom::linear<N>, loom::relu, ...); "
                  "its position and name are in the loom::diagnostic:: name the compiler prints");
    return fail_with<diagnostic::not_a_loom_layer_at_layer<Index, L>>();
  } else {
    return L::template check<Index, In>();
  }
}

template <bool Ok, class L, class In>
struct output_if {
  using type = In;
};
template <class L, class In>
struct output_if<true, L, In> {
  using type = typename L::template output_shape<In>;
};

template <bool Ok, class L, class In>
struct params_if : std::integral_constant<std::size_t, 0> {};
template <class L, class In>
struct params_if<true, L, In> : std::integral_constant<std::size_t, L::template parameter_count<In>> {};

template <bool Ok, class L, class In>
struct buffers_if : std::integral_constant<std::size_t, 0> {};
template <class L, class In>
struct buffers_if<true, L, In> : std::integral_constant<std::size_t, buffer_count_of<L, In>()> {};

template <bool Ok, class L, class In>
struct flops_if {
  static constexpr double value = 0;
};
template <class L, class In>
struct flops_if<true, L, In> {
  static constexpr double value = L::template flops<In>;
};

template <std::size_t Index, class In, class... Layers>
struct chain_step {
  static constexpr bool ok = true;
  using output = In;
  using inputs = type_list<>;
};

template <class... A, class... B>
type_list<A..., B...> concat(type_list<A...>, type_list<B...>);

template <std::size_t Index, class In, class L, class... Rest>
struct chain_step<Index, In, L, Rest...> {
  static constexpr bool here = check_layer<Index, In, L>();
  using out = typename output_if<here, L, In>::type;
  using next = std::conditional_t<here, chain_step<Index + 1, out, Rest...>, chain_step<Index + 1, In>>;
  static constexpr bool ok = here && next::ok;
  using output = typename next::output;
  using inputs = decltype(concat(type_list<In>{}, typename next::inputs{}));
};

/// Which of backward's two input-gradient buffers layer k >= 1 writes (entry 0 unused: layer 0
/// writes the caller's dx): the layers that run a backward (not `skipped`) alternate, counted
/// from layer 1, so each writes the buffer its gradient does not come from — k % 2 when none
/// is skipped.
template <std::size_t N>
constexpr std::array<std::size_t, N> gradient_buffers(const std::array<bool, N>& skipped) {
  std::array<std::size_t, N> b{};
  std::size_t running = 0;
  for (std::size_t k = 1; k < N; ++k) {
    if (!skipped[k]) ++running;
    b[k] = running % 2;
  }
  return b;
}

}  // namespace detail

/// The compile-time facts of layers Layers... applied in order to input shape In.
template <shape_type In, class... Layers>
struct layer_chain {
  static_assert(sizeof...(Layers) > 0, "loom::network needs at least one layer after loom::input<...>");
  using step = detail::chain_step<0, In, Layers...>;
  /// Whether every layer accepts its input (if not, a static_assert has already said why).
  static constexpr bool ok = step::ok;
  static constexpr std::size_t layer_count = sizeof...(Layers);
  using input_shape = In;
  using output_shape = typename step::output;
  using layers = type_list<Layers...>;
  /// inputs: the input shape of each layer, in order (valid when ok).
  using inputs = typename step::inputs;

 private:
  template <std::size_t... I>
  static constexpr auto counts(std::index_sequence<I...>) {
    if constexpr (ok)
      return std::array<std::size_t, sizeof...(I)>{detail::params_if<true, Layers, at<I, inputs>>::value...};
    else
      return std::array<std::size_t, sizeof...(I)>{};
  }
  template <std::size_t... I>
  static constexpr auto buffer_counts_of(std::index_sequence<I...>) {
    if constexpr (ok)
      return std::array<std::size_t, sizeof...(I)>{detail::buffers_if<true, Layers, at<I, inputs>>::value...};
    else
      return std::array<std::size_t, sizeof...(I)>{};
  }
  template <std::size_t... I>
  static constexpr auto layer_flops(std::index_sequence<I...>) {
    if constexpr (ok)
      return std::array<double, sizeof...(I)>{detail::flops_if<true, Layers, at<I, inputs>>::value...};
    else
      return std::array<double, sizeof...(I)>{};
  }

 public:
  /// Parameters of each layer.
  static constexpr std::array<std::size_t, layer_count> parameter_counts = counts(std::index_sequence_for<Layers...>{});
  /// Offset of each layer's parameters in the flat buffer.
  static constexpr std::array<std::size_t, layer_count> parameter_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t at = 0;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = at, at += parameter_counts[i];
    return o;
  }();
  static constexpr std::size_t parameter_count = [] {
    std::size_t s = 0;
    for (auto c : parameter_counts) s += c;
    return s;
  }();
  /// Buffers (values not trained: running statistics) of each layer, where they start in the
  /// flat buffer of buffers, and their sum.
  static constexpr std::array<std::size_t, layer_count> buffer_counts = buffer_counts_of(std::index_sequence_for<Layers...>{});
  static constexpr std::array<std::size_t, layer_count> buffer_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t at = 0;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = at, at += buffer_counts[i];
    return o;
  }();
  static constexpr std::size_t buffer_count = [] {
    std::size_t s = 0;
    for (auto c : buffer_counts) s += c;
    return s;
  }();
  /// Forward FLOPs per sample of each layer (the cost model used to balance pipeline stages).
  static constexpr std::array<double, layer_count> flops = layer_flops(std::index_sequence_for<Layers...>{});
  /// The input shape of layer I.
  template <std::size_t I>
  using input_of = at<I, inputs>;
  /// The output shape of layer I.
  template <std::size_t I>
  using output_of = typename at<I, layers>::template output_shape<input_of<I>>;
};

}  // namespace loom
