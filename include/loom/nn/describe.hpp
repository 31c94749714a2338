// SPDX-License-Identifier: Apache-2.0
#pragma once
// A layer list described by its layers' own descriptions (loom/layers/describe.hpp): each layer
// as the file formats see it (describe_chain: io/ describes a network with it, loom::residual
// its inner layers), and what loom::sequence allocates over the list (elements_of_sequence:
// loom::memory_plan counts a network's with it, loom::residual its inner layers'). Nothing here
// knows one layer from another.

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/type_list.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/named.hpp"
#include "loom/nn/chain.hpp"

namespace loom::detail {

// ---- The file formats' description -------------------------------------------------------------

/// Layer I of Chain (L), described and appended to out, its offsets from the chain's first
/// parameter (and first buffer); named by its loom::named name, or its index.
template <class Chain, std::size_t I, class L>
void describe_at(const std::string& prefix, std::vector<layer_description>& out) {
  using In = typename Chain::template input_of<I>;
  using Out = typename Chain::template output_of<I>;
  const chain_slot slot{.index = I, .name = child_name_of<L>(), .parameters = Chain::parameter_counts[I],
                        .at = Chain::parameter_offsets[I], .buffers = Chain::buffer_counts[I],
                        .buffer_at = Chain::buffer_offsets[I]};
  describe_into(prefix, slot, In::dims.data(), In::dims.size(), Out::dims.data(), Out::dims.size(),
                &describe_layer<L, In>, onnx_of<L, In>(), out);
}

template <class Chain, class... Layers, std::size_t... I>
void describe_each(const std::string& prefix, std::vector<layer_description>& out, std::index_sequence<I...>) {
  (describe_at<Chain, I, Layers>(prefix, out), ...);
}

/// The layers of Chain (Layers...), their paths prefix + index, their tensors' offsets from the
/// chain's first parameter.
template <class Chain, class... Layers>
std::vector<layer_description> describe_chain(const std::string& prefix) {
  std::vector<layer_description> out;
  describe_each<Chain, Layers...>(prefix, out, std::index_sequence_for<Layers...>{});
  return out;
}

// ---- What loom::sequence allocates --------------------------------------------------------------

/// Whether layer K of Chain runs inside layer K - 1 on Backend (loom::sequence's rule).
template <class Chain, std::size_t K, class Backend>
constexpr bool fused_in_sequence() {
  if constexpr (K == 0) {
    return false;
  } else {
    using prev = at<K - 1, typename Chain::layers>;
    return fuses_into_previous<typename prev::template impl<typename Chain::template input_of<K - 1>, float, Backend>,
                               at<K, typename Chain::layers>>;
  }
}

/// Whether layer K of Chain runs no backward on Backend: a ReLU fused into layer K - 1 whose
/// backward applies the ReLU's gradient itself, or a ReLU whose gradient layer K + 1 applies
/// (loom::sequence's rule).
template <class Chain, std::size_t K, class Backend>
constexpr bool backward_skipped_in_sequence() {
  if constexpr (K == 0) {
    return false;
  } else {
    using prev = at<K - 1, typename Chain::layers>;
    using prev_impl = typename prev::template impl<typename Chain::template input_of<K - 1>, float, Backend>;
    if constexpr (backward_fused_into_previous<prev_impl, at<K, typename Chain::layers>>) {
      return true;
    } else if constexpr (K + 1 >= Chain::layer_count) {
      return false;
    } else {
      using next = at<K + 1, typename Chain::layers>;
      return backward_fused_into_next<prev_impl, at<K, typename Chain::layers>,
                                      typename next::template impl<typename Chain::template input_of<K + 1>, float, Backend>>;
    }
  }
}

/// What loom::sequence allocates over Chain on Backend, its first layer in context c: one output
/// per layer that is not a fused ReLU, the two input-gradient buffers of backward (layer k >= 1
/// that runs a backward writes into buffer gradient_buffers(...)[k], sized for its input; layer
/// 0 writes the caller's dx), and each layer's own buffers (its footprint, in the layout its
/// input comes in).
template <class Chain, class Backend>
constexpr sequence_elements elements_of_sequence(const footprint_context& c) {
  if constexpr (!Chain::ok) {
    return {};
  } else {
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      constexpr std::size_t n = sizeof...(K);
      using layers = typename Chain::layers;
      constexpr std::array<bool, n> fused{fused_in_sequence<Chain, K, Backend>()...};
      constexpr std::array<bool, n> skipped{backward_skipped_in_sequence<Chain, K, Backend>()...};
      constexpr std::array<std::size_t, n> buffer_of = gradient_buffers(skipped);
      auto at_k = [&](std::size_t k, bool blocked) {
        return footprint_context{blocked, k > 0 || c.needs_input_gradient, c.accumulates, k + 1 < n && fused[k + 1]};
      };
      const std::array<sequence_elements, n> plain_input{
          footprint_of<at<K, layers>, typename Chain::template input_of<K>, Backend>(at_k(K, false))...};
      const std::array<sequence_elements, n> blocked_input{
          footprint_of<at<K, layers>, typename Chain::template input_of<K>, Backend>(at_k(K, true))...};
      constexpr std::array<layout_effect, n> effect{layout_of<at<K, layers>, typename Chain::template input_of<K>, Backend>()...};
      constexpr std::array<std::size_t, n> in{Chain::template input_of<K>::size...};
      constexpr std::array<std::size_t, n> out{Chain::template output_of<K>::size...};
      sequence_elements e;
      bool blocked = c.input_blocked;
      std::size_t gradient[2] = {0, 0};
      for (std::size_t k = 0; k < n; ++k) {
        e.add(blocked ? blocked_input[k] : plain_input[k]);
        if (!fused[k]) e.saved += out[k];
        if (k > 0 && !skipped[k]) gradient[buffer_of[k]] = std::max(gradient[buffer_of[k]], in[k]);
        blocked = effect[k] == layout_effect::blocks || (effect[k] == layout_effect::keeps && blocked);
      }
      e.scratch += gradient[0] + gradient[1];
      e.output_blocked = blocked;
      return e;
    }(std::make_index_sequence<Chain::layer_count>{});
  }
}

}  // namespace loom::detail
