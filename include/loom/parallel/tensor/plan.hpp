// SPDX-License-Identifier: Apache-2.0
#pragma once
// The compile-time half of tensor parallelism, beside the stage partition of pipelines
// (loom/parallel/pipeline/partition.hpp): loom::tensor_parallel_network<Network, Width>, the network one rank of a
// Width-way group runs (each loom::column_parallel and loom::row_parallel replaced by its
// slice), and loom::tensor_parallel_layout<Network, Width>, where each layer's parameters lie
// in the whole network and in one rank's slice (gather, scatter, norms over the group), and
// loom::tensor_parallel_widths<Network>, the widths it can be split by. The layers are in
// loom/layers/tensor_parallel.hpp; the policy in policy.hpp.

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "loom/backend/kernels/optim.hpp"
#include "loom/core/type_list.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/tensor_parallel.hpp"
#include "loom/nn/network.hpp"

namespace loom {

// ---- The network of one rank ------------------------------------------------------------------

namespace detail {
template <class Op, const char* Name>
std::true_type pointwise_test(const pointwise_layer<Op, Name>*);
std::false_type pointwise_test(...);
/// A point-wise activation (relu, tanh, ...): keeps a split activation split.
template <class L>
inline constexpr bool is_pointwise_v = decltype(pointwise_test(static_cast<const L*>(nullptr)))::value;

enum class tp_role : unsigned char { other, pointwise, column, row };
template <class L>
constexpr tp_role tp_role_of() {
  if constexpr (is_column_parallel_v<L>) return tp_role::column;
  else if constexpr (is_row_parallel_v<L>) return tp_role::row;
  else if constexpr (is_pointwise_v<L>) return tp_role::pointwise;
  else return tp_role::other;
}

/// Whether the column_parallel at i hands a row_parallel its split output: the next layer after
/// i that is not point-wise is a row_parallel.
template <std::size_t N>
constexpr bool output_stays_split(const std::array<tp_role, N>& roles, std::size_t i) {
  for (std::size_t j = i + 1; j < N; ++j)
    if (roles[j] != tp_role::pointwise) return roles[j] == tp_role::row;
  return false;
}
/// Whether the row_parallel at i gets a split input: the last layer before i that is not
/// point-wise is a column_parallel.
template <std::size_t N>
constexpr bool input_is_split(const std::array<tp_role, N>& roles, std::size_t i) {
  for (std::size_t j = i; j-- > 0;)
    if (roles[j] != tp_role::pointwise) return roles[j] == tp_role::column;
  return false;
}

template <class L, std::size_t Width, bool SplitOutput, bool SplitInput>
struct shard_of {
  using type = L;
};
template <std::size_t Out, class Init, std::size_t Width, bool SplitOutput, bool SplitInput>
struct shard_of<column_parallel<linear<Out, Init>>, Width, SplitOutput, SplitInput> {
  using type = column_parallel_shard<linear<Out, Init>, Width, SplitOutput>;
};
template <std::size_t Out, class Init, std::size_t Width, bool SplitOutput, bool SplitInput>
struct shard_of<row_parallel<linear<Out, Init>>, Width, SplitOutput, SplitInput> {
  using type = row_parallel_shard<linear<Out, Init>, Width, SplitInput>;
};

template <class Network, std::size_t Width, class Indices = std::make_index_sequence<Network::layer_count>>
struct tensor_parallel_network_impl;
template <std::size_t... D, class... Layers, std::size_t Width, std::size_t... I>
struct tensor_parallel_network_impl<network<input<D...>, Layers...>, Width, std::index_sequence<I...>> {
  static constexpr std::array<tp_role, sizeof...(Layers)> roles{tp_role_of<Layers>()...};
  using type = network<input<D...>,
                       typename shard_of<Layers, Width, output_stays_split(roles, I), input_is_split(roles, I)>::type...>;
};
}  // namespace detail

/// The network one rank of a Width-way tensor-parallel group runs: Network with every
/// column_parallel<L> and row_parallel<L> replaced by its slice (column_parallel_shard,
/// row_parallel_shard); other layers unchanged and whole on every rank. Layer indices — and so
/// every layer's random stream — are those of Network. Shapes and parameter counts are those of
/// one slice; a width that does not divide a layer's split dimension fails to compile, naming
/// the layer. Only the top-level layers are split: a column/row_parallel inside a residual runs
/// whole on every rank.
template <class Network, std::size_t Width>
using tensor_parallel_network = typename detail::tensor_parallel_network_impl<Network, Width>::type;

/// Where each layer's parameters lie in the whole network and in one rank's slice of it, for
/// gathering the slices (gather) and norms over a group (split_squares). Layer i is kind:
/// replicated (whole on every rank), column or row; rows x cols is the whole layer's W.
template <class Network, std::size_t Width>
struct tensor_parallel_layout {
  using whole_network = Network;
  using rank_network = tensor_parallel_network<Network, Width>;
  enum class kind : unsigned char { replicated, column, row };
  struct piece {
    kind role = kind::replicated;
    std::size_t whole_offset = 0, whole_count = 0;
    std::size_t rank_offset = 0, rank_count = 0;
    std::size_t rows = 0, cols = 0;  // the whole W (column, row)
  };
  static constexpr std::size_t layer_count = Network::layer_count;

 private:
  template <std::size_t I>
  static constexpr piece piece_at() {
    using L = at<I, typename Network::layers>;
    piece p;
    p.whole_offset = Network::parameter_offsets[I];
    p.whole_count = Network::parameter_counts[I];
    p.rank_offset = rank_network::parameter_offsets[I];
    p.rank_count = rank_network::parameter_counts[I];
    if constexpr (is_column_parallel_v<L> || is_row_parallel_v<L>) {
      p.role = is_column_parallel_v<L> ? kind::column : kind::row;
      p.rows = L::outputs;
      p.cols = Network::chain::template input_of<I>::size;
    }
    return p;
  }

 public:
  static constexpr std::array<piece, layer_count> pieces = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<piece, layer_count>{piece_at<I>()...};
  }(std::make_index_sequence<layer_count>{});

  /// Writes the whole network's flat parameters (Network::parameter_count) to whole from the
  /// Width ranks' slices, slices[r * rank_network::parameter_count ...], host memory. Replicated
  /// values and row_parallel biases are taken from rank 0.
  template <class T>
  static void gather(const T* slices, T* whole) {
    constexpr std::size_t per_rank = rank_network::parameter_count;
    for (const piece& p : pieces) {
      T* out = whole + p.whole_offset;
      if (p.role == kind::replicated) {
        std::copy_n(slices + p.rank_offset, p.whole_count, out);
      } else if (p.role == kind::column) {
        const std::size_t rows = p.rows / Width;
        for (std::size_t r = 0; r < Width; ++r) {
          const T* s = slices + r * per_rank + p.rank_offset;
          std::copy_n(s, rows * p.cols, out + r * rows * p.cols);        // W rows
          std::copy_n(s + rows * p.cols, rows, out + p.rows * p.cols + r * rows);  // b
        }
      } else {
        const std::size_t cols = p.cols / Width;
        for (std::size_t r = 0; r < Width; ++r) {
          const T* s = slices + r * per_rank + p.rank_offset;
          for (std::size_t i = 0; i < p.rows; ++i) std::copy_n(s + i * cols, cols, out + i * p.cols + r * cols);
        }
        std::copy_n(slices + p.rank_offset + p.rows * cols, p.rows, out + p.rows * p.cols);  // b, whole on every rank
      }
    }
  }

  /// The inverse of gather: rank `rank`'s slice (rank_network::parameter_count values) of the
  /// whole network's flat parameters, host memory — to load whole parameters into a split model.
  template <class T>
  static void scatter(const T* whole, std::size_t rank, T* slice) {
    for (const piece& p : pieces) {
      const T* in = whole + p.whole_offset;
      T* out = slice + p.rank_offset;
      if (p.role == kind::replicated) {
        std::copy_n(in, p.whole_count, out);
      } else if (p.role == kind::column) {
        const std::size_t rows = p.rows / Width;
        std::copy_n(in + rank * rows * p.cols, rows * p.cols, out);
        std::copy_n(in + p.rows * p.cols + rank * rows, rows, out + rows * p.cols);
      } else {
        const std::size_t cols = p.cols / Width;
        for (std::size_t i = 0; i < p.rows; ++i) std::copy_n(in + i * p.cols + rank * cols, cols, out + i * cols);
        std::copy_n(in + p.rows * p.cols, p.rows, out + p.rows * cols);
      }
    }
  }

  /// The sums of squares of one rank's values v (parameters or gradients, rank_network's
  /// layout, Backend's memory), in double: [0] over the split values (summed over the group,
  /// they give the whole layers'), [1] over the replicated ones (the same on every rank).
  template <class Backend, class T>
  static std::array<double, 2> split_squares(const T* v) {
    std::array<double, 2> s{0, 0};
    auto add = [&](std::size_t k, std::size_t offset, std::size_t n) {
      if (n) s[k] += Backend::sum(n, detail::squared_term<T>{v + offset});
    };
    for (const piece& p : pieces) {
      if (p.role == kind::replicated) {
        add(1, p.rank_offset, p.rank_count);
      } else if (p.role == kind::column) {
        add(0, p.rank_offset, p.rank_count);
      } else {
        add(0, p.rank_offset, p.rank_count - p.rows);       // W's columns
        add(1, p.rank_offset + p.rank_count - p.rows, p.rows);  // b
      }
    }
    return s;
  }
};

/// The tensor-parallel widths Network can be split by: the widths that divide the outputs of
/// every loom::column_parallel layer and the inputs of every loom::row_parallel layer (a width
/// that does not, does not compile), ascending. {1} when it has no such layer.
template <class Network>
inline constexpr auto tensor_parallel_widths = [] {
  constexpr std::size_t g = []<std::size_t... I>(std::index_sequence<I...>) {
    std::size_t d = 0;
    auto gcd = [](std::size_t a, std::size_t b) {
      while (b) a = std::exchange(b, a % b);
      return a;
    };
    auto split_dim = []<std::size_t K>(std::integral_constant<std::size_t, K>) -> std::size_t {
      using L = at<K, typename Network::layers>;
      if constexpr (is_column_parallel_v<L>) return L::outputs;
      else if constexpr (is_row_parallel_v<L>) return Network::chain::template input_of<K>::size;
      else return 0;
    };
    ((d = gcd(d, split_dim(std::integral_constant<std::size_t, I>{}))), ...);
    return d == 0 ? std::size_t{1} : d;
  }(std::make_index_sequence<Network::layer_count>{});
  constexpr std::size_t n = [] {
    std::size_t c = 0;
    for (std::size_t w = 1; w <= g; ++w) c += g % w == 0 ? 1 : 0;
    return c;
  }();
  std::array<std::size_t, n> out{};
  std::size_t k = 0;
  for (std::size_t w = 1; w <= g; ++w)
    if (g % w == 0) out[k++] = w;
  return out;
}();

}  // namespace loom
