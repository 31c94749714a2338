// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::network<input<D...>, Layers...>: the statically typed network. A pure type: its shapes,
// parameter count and per-layer offsets are compile-time constants; loom::model holds the
// parameters and runs it.

#include <array>
#include <cstddef>

#include "loom/nn/chain.hpp"
#include "loom/nn/sequence.hpp"

namespace loom {

/// The input of a network: one sample's shape, e.g. input<784> or input<1, 28, 28>.
template <std::size_t... D>
struct input {
  using shape_type = shape<D...>;
};

template <class T>
inline constexpr bool is_input_v = false;
template <std::size_t... D>
inline constexpr bool is_input_v<input<D...>> = true;

/// A network: loom::input<D...> followed by layers. A composition whose shapes do not fit does
/// not compile; the message names the layer's index and the shapes.
template <class Input, class... Layers>
struct network;

template <std::size_t... D, class... Layers>
struct network<input<D...>, Layers...> {
  using chain = layer_chain<shape<D...>, Layers...>;
  using input_shape = shape<D...>;
  using output_shape = typename chain::output_shape;
  using layers = type_list<Layers...>;
  static constexpr std::size_t layer_count = sizeof...(Layers);
  /// Number of trainable scalars, the size of the flat parameter (and gradient) buffer.
  static constexpr std::size_t parameter_count = chain::parameter_count;
  /// Parameters of layer i, and where they start in the flat buffer.
  static constexpr std::array<std::size_t, layer_count> parameter_counts = chain::parameter_counts;
  static constexpr std::array<std::size_t, layer_count> parameter_offsets = chain::parameter_offsets;
  /// Values the network holds that are not trained (batch norm's running statistics), the size
  /// of its flat buffer of buffers; each layer's, and where they start in it.
  static constexpr std::size_t buffer_count = chain::buffer_count;
  static constexpr std::array<std::size_t, layer_count> buffer_counts = chain::buffer_counts;
  static constexpr std::array<std::size_t, layer_count> buffer_offsets = chain::buffer_offsets;
  /// Forward FLOPs per sample, layer by layer and in all.
  static constexpr std::array<double, layer_count> layer_flops = chain::flops;
  static constexpr double flops_per_sample = [] {
    double s = 0;
    for (double f : chain::flops) s += f;
    return s;
  }();

  /// The run-time layer stack of this network for scalar T on Backend.
  template <class T, class Backend>
  using sequence_type = sequence<T, Backend, input_shape, Layers...>;
};

/// Not a network: the first type is not loom::input<...>. Says so, then stands in as an inert
/// network so that the code using it compiles without further errors.
template <class Input, class... Layers>
struct network : network<input<1>, detail::already_reported> {
  static_assert(is_input_v<Input>,
                "loom::network's first type must be loom::input<D...> giving one sample's shape, e.g. "
                "loom::network<loom::input<784>, loom::linear<10>>");
};

template <class T>
inline constexpr bool is_network_v = false;
template <class I, class... L>
inline constexpr bool is_network_v<network<I, L...>> = true;

}  // namespace loom
