// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of batch_norm.hpp's non-template functions (its ONNX node, its refusal of a
// channel of one value): included at the end of the header (header-only), or compiled once in
// src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/layers/batch_norm.hpp"

namespace loom::detail {

LOOM_DECL std::string batch_norm_onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
  // tensors: weight, bias (parameters), running_mean, running_var, num_batches_tracked (buffers).
  return g.add_float_node("BatchNormalization",
                          {x, g.initializer(d.tensors[0]), g.initializer(d.tensors[1]), g.initializer(d.tensors[2]),
                           g.initializer(d.tensors[3])},
                          {onnx_attr("epsilon", static_cast<float>(batch_norm::eps))});
}

LOOM_DECL void batch_norm_single_value(std::size_t layer, std::size_t batch, std::size_t channels, std::size_t spatial) {
  throw invalid_argument("loom::batch_norm at layer " + std::to_string(layer) +
                         ": expected more than 1 value per channel when training, got a batch of " +
                         std::to_string(batch) + (batch == 1 ? " sample" : " samples") + " with " +
                         std::to_string(spatial) + (spatial == 1 ? " value" : " values") + " per channel (" +
                         std::to_string(channels) + " channels): train with a larger batch, or evaluate");
}

}  // namespace loom::detail
