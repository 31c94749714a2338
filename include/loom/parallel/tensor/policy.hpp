// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::tensor_parallel<Width>: the policy of Megatron-style tensor parallelism, used as
// loom::model_parallel<loom::tensor_parallel<T>, Comm> or inside loom::hybrid<...>. Every rank
// of a group of Width ranks holds 1/Width of the weights of each loom::column_parallel and
// loom::row_parallel layer and sees the same samples. The layers are in
// loom/layers/tensor_parallel.hpp, the network of one rank in plan.hpp, their communication for
// the trainer's engine in sync.hpp; this header stays light (loom/parallel/model_parallel.hpp
// and hybrid.hpp name the policy).

#include <cstddef>

namespace loom {

/// Tensor parallelism over Width ranks.
template <std::size_t Width>
struct tensor_parallel {
  static_assert(Width >= 1, "loom::tensor_parallel<Width> needs Width >= 1");
  static constexpr std::size_t width = Width;
};

template <class T>
inline constexpr bool is_tensor_parallel_v = false;
template <std::size_t W>
inline constexpr bool is_tensor_parallel_v<tensor_parallel<W>> = true;

}  // namespace loom
