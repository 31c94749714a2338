// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::model_parallel<Parallelism, Comm>: one model split over a group of ranks, by a pipeline
// (loom::pipeline<Stages, ...>, loom/parallel/pipeline/) or by tensor parallelism
// (loom::tensor_parallel<Width>, loom/parallel/tensor/). A shared policy that dispatches to either
// strategy's members (the stages, schedule and partition of a pipeline; the width of a tensor
// group), so it includes both sub-folders (as hybrid.hpp does; tests/headers/layering.cmake).

#include <cstddef>
#include <type_traits>

#include "loom/parallel/pipeline/partition.hpp"
#include "loom/parallel/pipeline/policy.hpp"
#include "loom/parallel/tensor/policy.hpp"

namespace loom {

namespace detail {
/// What model_parallel exposes of a pipeline: its stage count, schedule and partitions.
template <class Parallelism>
struct model_parallel_members {};
template <std::size_t Stages, class... Options>
struct model_parallel_members<pipeline<Stages, Options...>> {
  using pipeline_type = pipeline<Stages, Options...>;
  static constexpr std::size_t stages = pipeline_type::stages;
  static constexpr std::size_t micro_batch_count = pipeline_type::micro_batch_count;
  /// The schedule's tables.
  using schedule = typename pipeline_type::schedule;
  /// Network's layers cut into stages.
  template <class Network>
  using partition = stage_partition<Network, pipeline_type>;

 private:
  using checked_ = std::bool_constant<pipeline_type::ok>;
};
template <std::size_t Width>
struct model_parallel_members<tensor_parallel<Width>> {
  /// Ranks that share each tensor-parallel layer.
  static constexpr std::size_t width = Width;
};
}  // namespace detail

/// Model parallelism over communicator Comm. Parallelism is a loom::pipeline<Stages, Options...>
/// (the layers cut into stages, one rank each) or a loom::tensor_parallel<Width> (the weights of
/// column_parallel / row_parallel layers split over Width ranks).
template <class Parallelism, class Comm>
struct model_parallel
    : detail::model_parallel_members<
          std::conditional_t<is_pipeline_v<Parallelism> || is_tensor_parallel_v<Parallelism>, Parallelism, pipeline<1>>> {
  static_assert(is_pipeline_v<Parallelism> || is_tensor_parallel_v<Parallelism>,
                "loom::model_parallel<Parallelism, Comm>: Parallelism must be loom::pipeline<Stages, Options...> or "
                "loom::tensor_parallel<Width>");
  using parallelism = std::conditional_t<is_pipeline_v<Parallelism> || is_tensor_parallel_v<Parallelism>, Parallelism, pipeline<1>>;
  using comm_type = Comm;
  /// Ranks one model is split over: the pipeline's stages, or the tensor-parallel width.
  static constexpr std::size_t group_size = [] {
    if constexpr (is_pipeline_v<parallelism>) return parallelism::stages;
    else return parallelism::width;
  }();
};

template <class T>
inline constexpr bool is_model_parallel_v = false;
template <class P, class C>
inline constexpr bool is_model_parallel_v<model_parallel<P, C>> = true;
}  // namespace loom
