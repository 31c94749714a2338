// SPDX-License-Identifier: Apache-2.0
// A layer of one's own that trains but does not describe itself, in a network saved to a weights
// file: the sentence says what to add, the marker names the layer.
// expect: does not describe itself
// expect: layer_does_not_describe_itself<unexplained>
// max-errors: 2
#include <cstddef>
#include <cstdint>

#include "loom/io/safetensors.hpp"
#include "loom/layers/layer.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/network.hpp"

/// The identity, with shapes and an implementation, but no describe() or onnx().
struct unexplained {
  static constexpr bool is_loom_layer = true;
  template <class In>
  static constexpr bool accepts = true;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    return true;
  }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 0;
  template <class In, class T, class Backend>
  struct impl {
    explicit impl(loom::layer_site) {}
    void initialize(T*, std::uint64_t) const {}
  };
};

using net = loom::network<loom::input<4>, loom::linear<3>, unexplained>;

int main() {
  const float w[net::parameter_count] = {};
  loom::save_weights<net, float>(w, "w.safetensors");
}
