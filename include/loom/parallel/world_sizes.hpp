// SPDX-License-Identifier: Apache-2.0
#pragma once
// The world sizes of a training job, at compile time: loom::world_size_rules<Network, Policy>
// (whether a world of n ranks trains the job with a given global batch and deterministic chunk,
// the largest such world up to a number of ranks, and why not, in a sentence) and
// loom::valid_world_sizes<Network, Policy, Batch, Chunk>, for a launcher that restarts a job on
// the ranks left. The rule on the grid is the rank grid's own (detail::grid_shape,
// rank_grid.hpp); what a policy makes of a network is the memory plan's detail::policy_facts
// (memory_plan.hpp). docs/memory-plan.md describes them.

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/parallel/memory_plan.hpp"
#include "loom/parallel/rank_grid.hpp"

namespace loom {

/// The world sizes on which the engines accept a job of Network under Policy, from the code's
/// own checks: a pipeline runs on exactly its S stages (model_parallel) or on replicas x S
/// (hybrid); tensor parallelism on T ranks, or replicas x T (the rank grid's one rule,
/// detail::grid_shape, which the engines apply); data parallelism on any number;
/// single_process on one. The global batch needs no divisibility (the loader splits it as
/// evenly as it goes, micro-batches too); the split-invariant mode (deterministic_chunk > 0)
/// runs only under single_process and data_parallel, with at least one chunk of a full batch
/// per rank (loom::chunk_plan). One rule more than the code's: every replica must get a sample
/// of a full batch (replicas <= batch): the trainer would run more, the extra replicas adding
/// zeros, but they would train nothing. Compile-time mistakes (more stages than layers, a
/// tensor width that does not divide a layer) do not compile, as in the trainer.
template <class Network, class Policy>
struct world_size_rules {
 private:
  using facts = detail::policy_facts<Network, Policy>;
  static_assert(facts::known,
                "loom::world_size_rules<Network, Policy>: Policy must be one of the trainer's: loom::single_process, "
                "loom::data_parallel<Comm, ...>, loom::model_parallel<loom::pipeline<S, ...>, Comm>, "
                "loom::model_parallel<loom::tensor_parallel<T>, Comm>, or a loom::hybrid<loom::data_parallel<Comm, ...>, "
                "...>");

 public:
  /// Ranks of one model replica, and whether a world may hold several replicas.
  static constexpr std::size_t group_size = facts::group;
  static constexpr bool replicated = facts::replicated;
  /// Whether the split-invariant mode (fit_options::deterministic_chunk) runs under Policy.
  static constexpr bool split_invariant = facts::deterministic;
  static constexpr bool network_fits = facts::network_fits;

  /// Whether a world of `world` ranks trains this job with global batch `batch` and
  /// deterministic_chunk `chunk` (0: off).
  static constexpr bool accepts(std::size_t world, std::size_t batch, std::size_t chunk = 0) noexcept {
    return network_fits && batch > 0 && world <= largest(batch, chunk) &&
           detail::grid_shape{.group = group_size, .replicated = replicated}.accepts(world);
  }
  /// The largest world accepted (0: none), so accepts(w) iff w is a multiple of group_size up
  /// to it (just group_size without replicas).
  static constexpr std::size_t largest(std::size_t batch, std::size_t chunk = 0) noexcept {
    if (!network_fits || batch == 0) return 0;
    if (chunk > 0 && !split_invariant) return 0;
    if (!replicated) return group_size;
    const std::size_t replicas = chunk > 0 ? (batch + chunk - 1) / chunk : batch;
    return replicas * group_size;
  }
  /// The largest world accepted that has at most `ranks` ranks (0: none): the size to restart
  /// on after failures left `ranks` ranks.
  static constexpr std::size_t largest_up_to(std::size_t ranks, std::size_t batch, std::size_t chunk = 0) noexcept {
    for (std::size_t w = std::min(ranks, largest(batch, chunk)); w > 0; --w)
      if (accepts(w, batch, chunk)) return w;
    return 0;
  }
  /// Every world size accepted, ascending.
  static constexpr std::vector<std::size_t> list(std::size_t batch, std::size_t chunk = 0) {
    std::vector<std::size_t> out;
    for (std::size_t w = group_size; w <= largest(batch, chunk); w += group_size)
      if (accepts(w, batch, chunk)) out.push_back(w);
    return out;
  }
  /// Why `world` does not train this job (empty when it does), in a sentence.
  static std::string why_not(std::size_t world, std::size_t batch, std::size_t chunk = 0) {
    if (accepts(world, batch, chunk)) return {};
    const std::string g = std::to_string(group_size), w = std::to_string(world), b = std::to_string(batch);
    if (world == 0) return "a world needs at least one rank";
    if (batch == 0) return "loom::trainer::fit refuses a batch of 0";
    if (chunk > 0 && !split_invariant)
      return "deterministic_chunk=" + std::to_string(chunk) +
             " needs loom::single_process or loom::data_parallel<Comm, ...>, not this policy";
    if (!replicated)
      return group_size == 1 ? "loom::single_process trains on one rank, not " + w
                             : "this policy splits the model over exactly " + g + " ranks, not " + w +
                                   " (for more, train replicas of it with loom::hybrid<loom::data_parallel<...>, ...>)";
    if (world % group_size != 0)
      return w + " ranks are not a whole number of model replicas of " + g + " ranks each";
    const std::size_t replicas = world / group_size;
    if (chunk > 0) {
      const std::size_t chunks = (batch + chunk - 1) / chunk;
      return "a full batch of " + b + " makes " + std::to_string(chunks) + " chunk" + (chunks == 1 ? "" : "s") + " of " +
             std::to_string(chunk) + " samples, fewer than the " + std::to_string(replicas) +
             " replicas, which each need at least one (loom::chunk_plan)";
    }
    return std::to_string(replicas) + " replicas for a batch of " + b + ": " + std::to_string(replicas - batch) +
           " would get no sample of a full batch";
  }
};

namespace detail {
template <class Rules, std::size_t Batch, std::size_t Chunk>
constexpr std::size_t count_world_sizes() {
  std::size_t n = 0;
  for (std::size_t w = 1; w <= Rules::largest(Batch, Chunk); ++w) n += Rules::accepts(w, Batch, Chunk) ? 1 : 0;
  return n;
}
}  // namespace detail

/// The world sizes that train Network under Policy with global batch Batch and
/// deterministic_chunk Chunk (0: off), ascending (see world_size_rules).
template <class Network, class Policy, std::size_t Batch, std::size_t Chunk = 0>
inline constexpr auto valid_world_sizes = [] {
  using rules = world_size_rules<Network, Policy>;
  std::array<std::size_t, detail::count_world_sizes<rules, Batch, Chunk>()> out{};
  std::size_t n = 0;
  for (std::size_t w = 1; w <= rules::largest(Batch, Chunk); ++w)
    if (rules::accepts(w, Batch, Chunk)) out[n++] = w;
  return out;
}();

}  // namespace loom
