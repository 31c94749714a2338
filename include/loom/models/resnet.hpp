// SPDX-License-Identifier: Apache-2.0
#pragma once
// Residual networks as loom networks, with torchvision's structure and names, so that their
// weights go both ways with torchvision.models.resnet18() and kin (load_state_dict, strict):
//
//   loom::models::resnet<18 | 34 | 50 | 101 | 152, Classes = 1000, Input = input<3, 224, 224>>
//     conv1 (7x7/2, no bias) bn1 relu maxpool (3x3/2, pad 1), layer1..layer4 of basic blocks
//     (18, 34) or bottlenecks (50 and up; stride on the 3x3, "ResNet v1.5", as torchvision),
//     avgpool (global), fc.
//   loom::models::resnet_cifar<20 | 32 | 44 | 56 | 110, Classes = 10, Input = input<3, 32, 32>>
//     He et al.'s CIFAR ResNet: conv1 (3x3, 16, no bias) bn1 relu, layer1..layer3 of n = (depth - 2) / 6
//     basic blocks of 16, 32 and 64 channels, global average pooling, fc. A block that changes
//     the shape takes option B's shortcut (a 1x1 strided convolution and a batch norm, named
//     "downsample" as torchvision's), not option A's zero padding.
//
// A block is a loom::residual_with named "layer<k>.<i>" and followed by a loom::relu (the ReLU
// after the addition, fused into it); the other layers are named "conv1", "bn1", "fc" as the
// PyTorch module's attributes. Parameter counts at 3x224x224 and 1,000 classes are
// torchvision's (tests/models).

#include <cstddef>
#include <type_traits>
#include <utility>

#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/named.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/network.hpp"
#include "loom/nn/residual_with.hpp"

namespace loom::models {

/// torchvision's BasicBlock: conv1 3x3 (stride), bn1, relu, conv2 3x3, bn2, added to the input or,
/// when Downsample, to downsample (a 1x1 convolution of stride Stride and a batch norm). The
/// ReLU after the sum is the network's next layer.
template <std::size_t Planes, std::size_t Stride, bool Downsample>
using basic_block =
    residual_with<layers<named<"conv1", conv2d<Planes, 3, Stride, 1, no_bias>>, named<"bn1", batch_norm>, relu,
                         named<"conv2", conv2d<Planes, 3, 1, 1, no_bias>>, named<"bn2", batch_norm>>,
                  std::conditional_t<Downsample, named<"downsample", shortcut<conv2d<Planes, 1, Stride, 0, no_bias>, batch_norm>>,
                                     shortcut<>>>;

/// torchvision's Bottleneck (ResNet v1.5: the stride on the 3x3): conv1 1x1, bn1, relu, conv2
/// 3x3 (stride), bn2, relu, conv3 1x1 to 4 Planes, bn3, and downsample as basic_block's.
template <std::size_t Planes, std::size_t Stride, bool Downsample>
using bottleneck =
    residual_with<layers<named<"conv1", conv2d<Planes, 1, 1, 0, no_bias>>, named<"bn1", batch_norm>, relu,
                         named<"conv2", conv2d<Planes, 3, Stride, 1, no_bias>>, named<"bn2", batch_norm>, relu,
                         named<"conv3", conv2d<4 * Planes, 1, 1, 0, no_bias>>, named<"bn3", batch_norm>>,
                  std::conditional_t<Downsample,
                                     named<"downsample", shortcut<conv2d<4 * Planes, 1, Stride, 0, no_bias>, batch_norm>>,
                                     shortcut<>>>;

namespace detail {

template <class... L>
struct concat_lists {
  using type = type_list<>;
};
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};

template <class Input, class List>
struct network_of;
template <class Input, class... L>
struct network_of<Input, type_list<L...>> {
  using type = network<Input, L...>;
};

constexpr std::size_t digits(std::size_t v) { return v < 10 ? 1 : 1 + digits(v / 10); }

/// "layer<Stage>.<Index>": the name of a block as torchvision's nn.Sequential stages give it.
template <std::size_t Stage, std::size_t Index>
constexpr auto block_name() {
  constexpr std::size_t n = 5 + digits(Stage) + 1 + digits(Index);
  char s[n + 1] = "layer";
  std::size_t at = 5;
  auto put = [&](std::size_t v) {
    const std::size_t d = digits(v);
    for (std::size_t k = 0; k < d; ++k, v /= 10) s[at + d - 1 - k] = static_cast<char>('0' + v % 10);
    at += d;
  };
  put(Stage);
  s[at++] = '.';
  put(Index);
  s[at] = '\0';
  return fixed_string<n + 1>(s);
}

/// One stage: Blocks blocks of Planes (Block<Planes, Stride, Downsample>), the first with the
/// stride and, when it changes the shape, the downsample; each named and followed by a ReLU.
template <std::size_t Stage, template <std::size_t, std::size_t, bool> class Block, std::size_t Planes,
          std::size_t Stride, bool FirstDownsamples, std::size_t... I>
auto stage_list(std::index_sequence<I...>) ->
    typename concat_lists<type_list<named<block_name<Stage, I>(), Block<Planes, I == 0 ? Stride : 1, I == 0 && FirstDownsamples>>,
                                    relu>...>::type;

template <std::size_t Stage, template <std::size_t, std::size_t, bool> class Block, std::size_t Expansion,
          std::size_t InPlanes, std::size_t Planes, std::size_t Stride, std::size_t Blocks>
using stage = decltype(stage_list<Stage, Block, Planes, Stride, Stride != 1 || InPlanes != Planes * Expansion>(
    std::make_index_sequence<Blocks>{}));

/// A ResNet's block counts per stage, by depth (torchvision's table).
struct resnet_layout {
  bool bottleneck;
  std::size_t blocks[4];
};
constexpr resnet_layout resnet_layout_of(std::size_t depth) {
  switch (depth) {
    case 18: return {false, {2, 2, 2, 2}};
    case 34: return {false, {3, 4, 6, 3}};
    case 50: return {true, {3, 4, 6, 3}};
    case 101: return {true, {3, 4, 23, 3}};
    case 152: return {true, {3, 8, 36, 3}};
    default: return {false, {0, 0, 0, 0}};
  }
}
constexpr bool resnet_depth(std::size_t depth) { return resnet_layout_of(depth).blocks[0] > 0; }

template <std::size_t Depth, std::size_t Classes, class Input>
struct resnet_of {
  static_assert(resnet_depth(Depth),
                "loom::models::resnet<Depth>: Depth is one of torchvision's ResNets: 18, 34, 50, 101 or 152");
  static constexpr resnet_layout l = resnet_depth(Depth) ? resnet_layout_of(Depth) : resnet_layout_of(18);
  static constexpr std::size_t e = l.bottleneck ? 4 : 1;
  template <std::size_t P, std::size_t S, bool D>
  using block = std::conditional_t<l.bottleneck, bottleneck<P, S, D>, basic_block<P, S, D>>;
  using stem = type_list<named<"conv1", conv2d<64, 7, 2, 3, no_bias>>, named<"bn1", batch_norm>, relu, max_pool2d<3, 2, 1>>;
  using head = type_list<global_avg_pool2d, named<"fc", linear<Classes>>>;
  using type = typename network_of<
      Input, typename concat_lists<stem, stage<1, block, e, 64, 64, 1, l.blocks[0]>,
                                   stage<2, block, e, 64 * e, 128, 2, l.blocks[1]>,
                                   stage<3, block, e, 128 * e, 256, 2, l.blocks[2]>,
                                   stage<4, block, e, 256 * e, 512, 2, l.blocks[3]>, head>::type>::type;
};

template <std::size_t Depth, std::size_t Classes, class Input>
struct resnet_cifar_of {
  static_assert(Depth >= 8 && (Depth - 2) % 6 == 0,
                "loom::models::resnet_cifar<Depth>: Depth is 6 n + 2 (20, 32, 44, 56, 110): n basic blocks in each "
                "of 3 stages");
  static constexpr std::size_t n = Depth >= 8 && (Depth - 2) % 6 == 0 ? (Depth - 2) / 6 : 1;
  using stem = type_list<named<"conv1", conv2d<16, 3, 1, 1, no_bias>>, named<"bn1", batch_norm>, relu>;
  using head = type_list<global_avg_pool2d, named<"fc", linear<Classes>>>;
  using type = typename network_of<
      Input, typename concat_lists<stem, stage<1, basic_block, 1, 16, 16, 1, n>, stage<2, basic_block, 1, 16, 32, 2, n>,
                                   stage<3, basic_block, 1, 32, 64, 2, n>, head>::type>::type;
};

}  // namespace detail

/// torchvision's resnet18 / 34 / 50 / 101 / 152 (see the file comment) on Input (any image big
/// enough for five halvings, 3x224x224 by default) with Classes outputs.
template <std::size_t Depth, std::size_t Classes = 1000, class Input = input<3, 224, 224>>
using resnet = typename detail::resnet_of<Depth, Classes, Input>::type;

/// The CIFAR ResNet of depth 6 n + 2 (20, 32, 44, 56, 110) with option B shortcuts (see the
/// file comment), on Input (3x32x32 by default) with Classes outputs.
template <std::size_t Depth, std::size_t Classes = 10, class Input = input<3, 32, 32>>
using resnet_cifar = typename detail::resnet_cifar_of<Depth, Classes, Input>::type;

}  // namespace loom::models
