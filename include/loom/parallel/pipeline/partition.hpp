// SPDX-License-Identifier: Apache-2.0
#pragma once
// The partition of pipeline model parallelism: loom::stage_partition<Network, Pipeline>, how a
// network's layers are cut into the pipeline's stages (the user's loom::cut_at<...>, or cuts
// balanced by a cost model), what each stage holds (its layers, parameters, buffers, FLOPs, the
// elements it sends on) and each stage as an ordinary loom::network. The pipeline's policy and
// options are policy.hpp's.

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "loom/core/shape.hpp"
#include "loom/core/type_list.hpp"
#include "loom/layers/layer.hpp"
#include "loom/nn/network.hpp"
#include "loom/parallel/pipeline/diagnostics.hpp"
#include "loom/parallel/pipeline/policy.hpp"

namespace loom {

namespace detail {
template <class Shape>
struct input_for_shape;
template <std::size_t... D>
struct input_for_shape<shape<D...>> {
  using type = input<D...>;
};

template <class Network, std::size_t First, class Indices>
struct sub_network;
template <class Input, class... Layers, std::size_t First, std::size_t... K>
struct sub_network<network<Input, Layers...>, First, std::index_sequence<K...>> {
  using chain = typename network<Input, Layers...>::chain;
  using type = network<typename input_for_shape<typename chain::template input_of<First>>::type,
                       at<First + K, type_list<Layers...>>...>;
};

/// Elements per sample of each layer's input, then of the network's output.
template <class Network, std::size_t... I>
constexpr auto boundary_sizes(std::index_sequence<I...>) {
  using chain = typename Network::chain;
  if constexpr (chain::ok)
    return std::array<std::size_t, sizeof...(I) + 1>{chain::template input_of<I>::size..., chain::output_shape::size};
  else
    return std::array<std::size_t, sizeof...(I) + 1>{};
}

/// Cut points that minimise the largest stage cost; among those, the smallest sum of squared
/// stage costs; then the earliest cuts. Exact: a dynamic programme over (stages, prefix).
/// Requires L >= S >= 1.
template <std::size_t L, std::size_t S>
constexpr std::array<std::size_t, S + 1> balance(const std::array<double, L>& cost) {
  std::array<double, L + 1> prefix{};
  for (std::size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + cost[i];
  constexpr double none = -1;
  // Pass 1: worst[k][j] = the least possible largest stage cost of layers [0, j) in k stages.
  std::array<std::array<double, L + 1>, S + 1> worst{};
  for (auto& row : worst) row.fill(none);
  for (std::size_t j = 1; j <= L; ++j) worst[1][j] = prefix[j];
  for (std::size_t k = 2; k <= S; ++k)
    for (std::size_t j = k; j <= L; ++j)
      for (std::size_t i = k - 1; i < j; ++i) {
        const double c = prefix[j] - prefix[i];
        const double w = worst[k - 1][i] > c ? worst[k - 1][i] : c;
        if (worst[k][j] == none || w < worst[k][j]) worst[k][j] = w;
      }
  const double limit = worst[S][L];
  // Pass 2: squares[k][j] = the least sum of squared stage costs with no stage above limit.
  std::array<std::array<double, L + 1>, S + 1> squares{};
  std::array<std::array<std::size_t, L + 1>, S + 1> from{};
  for (auto& row : squares) row.fill(none);
  for (std::size_t j = 1; j <= L; ++j)
    if (prefix[j] <= limit) squares[1][j] = prefix[j] * prefix[j];
  for (std::size_t k = 2; k <= S; ++k)
    for (std::size_t j = k; j <= L; ++j)
      for (std::size_t i = k - 1; i < j; ++i) {
        const double c = prefix[j] - prefix[i];
        if (squares[k - 1][i] == none || c > limit) continue;
        const double q = squares[k - 1][i] + c * c;
        if (squares[k][j] == none || q < squares[k][j]) squares[k][j] = q, from[k][j] = i;
      }
  std::array<std::size_t, S + 1> bounds{};
  bounds[S] = L;
  for (std::size_t k = S; k > 1; --k) bounds[k - 1] = from[k][bounds[k]];
  return bounds;
}

template <class Network, class Pipeline>
constexpr bool check_partition() {
  constexpr std::size_t S = Pipeline::stages, L = Network::layer_count;
  if constexpr (!Pipeline::ok || !Network::chain::ok) {
    return false;  // already reported
  } else if constexpr (S > L) {
    static_assert(S <= L,
                  "loom::pipeline: more stages than the network has layers: every stage needs at least one layer (both "
                  "numbers are in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::more_stages_than_layers<S, L>>();
  } else {
    constexpr auto& cuts = Pipeline::cut_points;
    constexpr std::size_t bad = [] {
      // A range-for: with no cut points, `i < cuts.size()` would compare with 0 (nvcc's #186-D).
      std::size_t i = 0;
      for (std::size_t c : cuts) {
        if (c < 1 || c >= L) return i;
        ++i;
      }
      return cuts.size();
    }();
    if constexpr (bad < cuts.size()) {
      static_assert(bad >= cuts.size(),
                    "loom::cut_at<...>: a cut point is out of range: each is the index of the first layer of a stage "
                    "after the first, in [1, layer_count - 1] (the cut point's position, its value and the layer count "
                    "are in the loom::diagnostic:: name the compiler prints)");
      return fail_with<diagnostic::cut_point_out_of_range<bad, cuts[bad], L>>();
    } else {
      return true;
    }
  }
}
}  // namespace detail

/// The layers of Network cut into Pipeline::stages stages: stage s owns layers
/// [bounds[s], bounds[s + 1]) and only their parameters, in its own flat buffer.
///
/// Cost model, for balancing: a layer costs its forward FLOPs per sample as each layer states
/// them (`flops<In>`: 2 * in * out for linear, 2 * k^2 * c_in per output element for conv2d, one
/// per element for activations and pooling windows), but at least the number of elements of its
/// input, which every layer reads (so flatten, a copy, is not free). The backward pass costs
/// about twice the forward in every layer, so counting it would scale all costs alike and choose
/// the same cuts. Without cut_at, the cuts minimise the cost of the most expensive stage (the
/// one that sets the pace of the pipeline); among equally good cuts, the one with the smallest
/// sum of squared stage costs (the other stages as even as possible), then the earliest.
/// Communication is not counted.
template <class Network, class Pipeline>
struct stage_partition {
  static_assert(is_network_v<Network>, "loom::stage_partition<Network, Pipeline>: Network must be a loom::network<...>");
  static_assert(is_pipeline_v<Pipeline>, "loom::stage_partition<Network, Pipeline>: Pipeline must be a loom::pipeline<...>");
  static constexpr std::size_t stages = Pipeline::stages;
  static constexpr std::size_t layer_count = Network::layer_count;
  /// Whether the partition is sound (if not, a static_assert has said why).
  static constexpr bool ok = detail::check_partition<Network, Pipeline>();

  /// Elements per sample entering layer i (i < layer_count) and leaving the network (i =
  /// layer_count).
  static constexpr std::array<std::size_t, layer_count + 1> boundary_sizes =
      detail::boundary_sizes<Network>(std::make_index_sequence<layer_count>{});
  /// Each layer's cost (see the cost model above).
  static constexpr std::array<double, layer_count> layer_costs = [] {
    std::array<double, layer_count> c{};
    for (std::size_t i = 0; i < layer_count; ++i) {
      const double elements = static_cast<double>(boundary_sizes[i]);
      c[i] = Network::layer_flops[i] > elements ? Network::layer_flops[i] : elements;
    }
    return c;
  }();

  /// Stage s owns layers [bounds[s], bounds[s + 1]).
  static constexpr std::array<std::size_t, stages + 1> bounds = [] {
    std::array<std::size_t, stages + 1> b{};
    if constexpr (ok) {
      if constexpr (Pipeline::balanced) {
        b = detail::balance<layer_count, stages>(layer_costs);
      } else {
        for (std::size_t s = 1; s < stages; ++s) b[s] = Pipeline::cut_points[s - 1];
        b[stages] = layer_count;
      }
    }
    return b;
  }();
  /// The stage that owns layer i.
  static constexpr std::size_t stage_of_layer(std::size_t i) {
    std::size_t s = 0;
    while (s + 1 < stages && bounds[s + 1] <= i) ++s;
    return s;
  }
  /// Layers per stage.
  static constexpr std::array<std::size_t, stages> layer_counts = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s) n[s] = bounds[s + 1] - bounds[s];
    return n;
  }();
  /// Parameters per stage: the size of stage s's own flat parameter (and gradient) buffer.
  static constexpr std::array<std::size_t, stages> parameter_counts = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) n[s] += Network::parameter_counts[i];
    return n;
  }();
  /// Where stage s's parameters start in the whole network's flat buffer (for checkpoints that
  /// gather the stages into one model).
  static constexpr std::array<std::size_t, stages> parameter_offsets = [] {
    std::array<std::size_t, stages> o{};
    for (std::size_t s = 0; s < stages; ++s) o[s] = bounds[s] < layer_count ? Network::parameter_offsets[bounds[s]] : 0;
    return o;
  }();
  /// Buffers (running statistics) per stage, and where stage s's start in the whole network's
  /// flat buffer of buffers: a stage holds its own layers'.
  static constexpr std::array<std::size_t, stages> buffer_counts = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) n[s] += Network::buffer_counts[i];
    return n;
  }();
  static constexpr std::array<std::size_t, stages> buffer_offsets = [] {
    std::array<std::size_t, stages> o{};
    for (std::size_t s = 0; s < stages; ++s) o[s] = bounds[s] < layer_count ? Network::buffer_offsets[bounds[s]] : 0;
    return o;
  }();
  /// Forward FLOPs per sample of each stage (the sum of its layers' Network::layer_flops).
  static constexpr std::array<double, stages> flops = [] {
    std::array<double, stages> f{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) f[s] += Network::layer_flops[i];
    return f;
  }();
  /// Each stage's cost (the sum of its layer_costs), and the largest: the pipeline's pace.
  static constexpr std::array<double, stages> costs = [] {
    std::array<double, stages> c{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) c[s] += layer_costs[i];
    return c;
  }();
  static constexpr double bottleneck_cost = [] {
    double m = 0;
    for (double c : costs) m = c > m ? c : m;
    return m;
  }();
  /// Elements per sample stage s sends to stage s + 1 (and receives back as their gradient);
  /// for the last stage, the network's output.
  static constexpr std::array<std::size_t, stages> output_sizes = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s) n[s] = boundary_sizes[bounds[s + 1]];
    return n;
  }();

  /// Stage Stage as an ordinary loom::network: input = the previous stage's output shape, then
  /// its layers. Its parameter_count is parameter_counts[Stage] and its parameter_offsets are
  /// the network's, less parameter_offsets[Stage]. Layer i of the stage is layer bounds[Stage]
  /// + i of the network (the index that seeds its random stream).
  template <std::size_t Stage>
  using stage_network = typename std::conditional_t<
      ok, detail::sub_network<Network, bounds[Stage < stages ? Stage : 0],
                              std::make_index_sequence<bounds[(Stage < stages ? Stage : 0) + 1] - bounds[Stage < stages ? Stage : 0]>>,
      std::type_identity<network<input<1>, detail::already_reported>>>::type;

 private:
  using checked_ = std::bool_constant<ok>;
};

}  // namespace loom
