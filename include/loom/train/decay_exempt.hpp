// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which values of a network get no weight decay under decay_norm_and_bias = false (loom::sgd,
// adam, adamw): the weight and bias of every batch_norm and layer_norm and every layer's bias,
// found in the network's own description (its layers' describe(): PyTorch names and the layer
// that owns them), once per network type; and those ranges as a rank's optimizer state holds
// them (its shard map: the whole model, a pipeline stage, a tensor slice, ZeRO's slices that
// cut across layers), which the trainer gives the state (set_decay_exempt).

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/io/layer_description.hpp"
#include "loom/optim/decay_exempt.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom::detail {

/// Whether a layer of this description is a normalization layer (every parameter exempt).
inline bool is_norm_layer(const layer_description& d) {
  const std::string_view t = d.text;
  return t.starts_with("batch_norm") || t.starts_with("layer_norm");
}

/// The exempt ranges of `layers` (and their inner layers) in the network's flat layout.
inline void collect_decay_exempt(const std::vector<layer_description>& layers, std::vector<index_range>& out) {
  for (const layer_description& d : layers) {
    const bool norm = is_norm_layer(d);
    for (const tensor_description& t : d.tensors) {
      if (t.kind != tensor_kind::parameter || t.count == 0) continue;
      const std::string_view name = t.name;
      const std::size_t dot = name.rfind('.');
      const std::string_view own = dot == std::string_view::npos ? name : name.substr(dot + 1);
      if (norm || own == "bias") out.push_back({t.offset, t.offset + t.count});
    }
    collect_decay_exempt(d.inner, out);
  }
}

/// The network's exempt ranges, sorted and merged (offsets in Network's flat parameter layout).
inline std::vector<index_range> decay_exempt_of(const io::network_description& net) {
  std::vector<index_range> r;
  collect_decay_exempt(net.layers, r);
  decay_exemption merged;
  merged.set(std::move(r));
  return merged.ranges();
}

/// `whole` (exempt ranges of the whole layout, sorted and merged) as the rank that holds `map`
/// keeps them: each block's runs intersected with them, at their local offsets.
inline std::vector<index_range> state_decay_exempt(const shard_map& map, const std::vector<index_range>& whole) {
  std::vector<index_range> out;
  for (const shard_piece& p : map.pieces)
    for (std::size_t i = 0; i < p.rows; ++i) {
      const std::size_t wb = p.whole_offset + i * p.whole_stride, we = wb + p.count;
      const std::size_t lb = p.local_offset + i * p.local_stride;
      auto r = std::upper_bound(whole.begin(), whole.end(), wb, [](std::size_t v, const index_range& x) { return v < x.end; });
      for (; r != whole.end() && r->begin < we; ++r) {
        const std::size_t b = std::max(r->begin, wb), e = std::min(r->end, we);
        if (e > b) out.push_back({lb + (b - wb), lb + (e - wb)});
      }
    }
  return out;
}

}  // namespace loom::detail
