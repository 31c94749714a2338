// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::hybrid<loom::data_parallel<Comm, ...>, Parallelism>: a 2-D grid of ranks. Each model
// replica is split over a group of P ranks (P = the pipeline's stages, or the tensor-parallel
// width); D = world size / P replicas train by data parallelism.
//
// Grid: world rank r is model-parallel index r % P (its stage, or its weight slice) in replica
// r / P. Consecutive ranks form one model-parallel group — the traffic-heavy group stays on one
// machine when ranks are placed by slot (mpirun's default). The world communicator is split by
// colour twice: model-parallel groups (colour r / P) carry pipeline messages or tensor-parallel
// allreduces; data-parallel groups (colour r % P) carry only the gradient allreduce (under
// shard_optimizer_state, its reduce-scatter and the parameters' allgather).

#include <cstddef>
#include <type_traits>

#include "loom/parallel/data/data_parallel.hpp"
#include "loom/parallel/model_parallel.hpp"
#include "loom/parallel/pipeline/policy.hpp"
#include "loom/parallel/tensor/policy.hpp"

namespace loom {

namespace detail {
/// DataParallel's communicator; void for a type that is not a data_parallel, which hybrid has
/// refused by then, so that no error follows its message.
template <class DataParallel>
constexpr auto comm_of_data_parallel() {
  if constexpr (is_data_parallel_v<DataParallel>) return std::type_identity<typename DataParallel::comm_type>{};
  else return std::type_identity<void>{};
}
}  // namespace detail

template <class DataParallel, class Parallelism>
struct hybrid {
  static_assert(is_data_parallel_v<DataParallel>,
                "loom::hybrid<DataParallel, Parallelism>: DataParallel must be loom::data_parallel<Comm, ...>");
  static_assert(is_pipeline_v<Parallelism> || is_tensor_parallel_v<Parallelism>,
                "loom::hybrid<DataParallel, Parallelism>: Parallelism must be loom::pipeline<Stages, ...> or "
                "loom::tensor_parallel<Width>");
  static_assert(!detail::chooses_at_run_time_v<DataParallel>,
                "loom::hybrid<loom::data_parallel<Comm, loom::choose_at_run_time>, ...>: the run-time choice of the "
                "wire format and ZeRO is built for plain loom::data_parallel only; name the options (compress<H>) "
                "in the hybrid's data_parallel");
  static_assert(!(detail::syncs_batch_norm_v<DataParallel> && is_pipeline_v<Parallelism>),
                "loom::hybrid<loom::data_parallel<Comm, ..., loom::sync_batch_norm>, loom::pipeline<...>>: a "
                "pipeline's batch norms normalise per micro-batch (as GPipe), whose stages run at different times "
                "on each replica; drop sync_batch_norm (it is for data_parallel and hybrid with tensor_parallel)");
  using data_parallel_type = DataParallel;
  using comm_type = typename decltype(detail::comm_of_data_parallel<DataParallel>())::type;
  /// The same split of one replica as model_parallel<Parallelism, Comm> gives (a stand-in
  /// pipeline when Parallelism is neither, which hybrid has already refused).
  using model_parallel_type =
      model_parallel<std::conditional_t<is_pipeline_v<Parallelism> || is_tensor_parallel_v<Parallelism>, Parallelism,
                                        pipeline<1>>,
                     comm_type>;
  using parallelism = Parallelism;
  /// Ranks per model replica (P).
  static constexpr std::size_t group_size = model_parallel_type::group_size;
};

template <class T>
inline constexpr bool is_hybrid_v = false;
template <class D, class P>
inline constexpr bool is_hybrid_v<hybrid<D, P>> = true;

}  // namespace loom
