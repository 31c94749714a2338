// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::named<"conv1", Layer>: Layer under a name of its own. In the files a layer is named by its
// path in the network, as torch.nn.Sequential names its children: "3.weight" for the layer at
// index 3, "3.1.weight" inside a residual. A named layer takes its name instead of its index, so
// that "conv1.weight", "layer1.0.bn1.running_mean" or "fc.bias" come out as a PyTorch module with
// those attribute names has them (torchvision's models: loom/models/resnet.hpp). The name may hold
// dots ("layer1.0": the first block of torchvision's layer1). Everything else is Layer's.

#include <cstddef>
#include <string_view>

#include "loom/layers/describe.hpp"

namespace loom {

/// A string as a template argument: named<"conv1", ...>.
template <std::size_t N>
struct fixed_string {
  char value[N]{};
  constexpr fixed_string(const char (&s)[N]) {  // NOLINT: implicit, so that "conv1" converts
    for (std::size_t i = 0; i < N; ++i) value[i] = s[i];
  }
  constexpr std::string_view view() const { return {value, N - 1}; }
};

/// Layer, named Name in the files (its tensors "Name.weight", its inner layers' "Name.0.weight")
/// and in its ONNX nodes ("/Name/Conv"); its text in the network's fingerprint reads
/// "Name:text". It computes, checks and plans as Layer does: every member is Layer's.
template <fixed_string Name, class Layer>
struct named : Layer {
  static_assert(Name.view().size() > 0, "loom::named<Name, Layer>: the name must not be empty");
  /// The name a chain gives this layer instead of its index (loom/nn/describe.hpp).
  static constexpr std::string_view child_name = Name.view();
  using unnamed_type = Layer;
};

/// A named layer described from outside (layer_traits<Layer>) is described the same way.
template <fixed_string Name, class Layer>
struct layer_traits<named<Name, Layer>> : layer_traits<Layer> {};

namespace detail {
/// The name a chain gives layer L at index i: its child_name (loom::named), or none (the index).
template <class L>
constexpr std::string_view child_name_of() {
  if constexpr (requires { L::child_name; }) return L::child_name;
  else return {};
}
}  // namespace detail

}  // namespace loom
