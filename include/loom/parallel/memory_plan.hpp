// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::memory_plan<Network, Optimizer, Policy, Options...>: the bytes of loom's buffers on each
// rank before a training job runs — parameters, gradients, optimizer state, communication
// buffers, and per sample what the passes keep (at the schedule's peak for a pipeline) — counted
// from the buffers the code allocates (loom::sequence's outputs and gradient buffers, the layers'
// own, the engines', the trainer's batch); with loom::memory_budget<Bytes> and
// loom::max_batch<N>, a plan that does not fit is a compile error naming the rank, the bytes and
// the largest batch that fits. Its facts about each policy (detail::policy_facts: ranks per
// replica, replication, what each rank holds) also serve the world sizes (world_sizes.hpp).
// A shared file that names every strategy's policy and plan, so it includes data/, pipeline/
// and tensor/ (the exceptions in tests/headers/layering.cmake).
//
// docs/memory-plan.md describes it, what the plan leaves out, and how it was measured.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "loom/backend/default_backend.hpp"
#include "loom/core/error.hpp"
#include "loom/core/type_list.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"
#include "loom/layers/tensor_parallel.hpp"
#include "loom/nn/describe.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/network.hpp"
#include "loom/parallel/data/bucket_plan.hpp"
#include "loom/parallel/data/data_parallel.hpp"
#include "loom/parallel/hybrid.hpp"
#include "loom/parallel/model_parallel.hpp"
#include "loom/parallel/pipeline/partition.hpp"
#include "loom/parallel/pipeline/policy.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/single_process.hpp"
#include "loom/parallel/tensor/policy.hpp"
#include "loom/parallel/tensor/plan.hpp"

namespace loom {

// ---- Options ------------------------------------------------------------------------------------

/// Option of memory_plan: every rank must fit in Bytes at max_batch<N> (both needed), or the
/// plan does not compile.
template <std::size_t Bytes>
struct memory_budget {
  static constexpr std::size_t bytes = Bytes;
};

/// Option of memory_plan: the largest global batch of the job, at which memory_budget is
/// checked on one replica (where a rank needs the most: more replicas only shrink its share),
/// so a plan that compiles fits on every world size the policy allows.
template <std::size_t Samples>
struct max_batch {
  static constexpr std::size_t samples = Samples;
};

/// Option of memory_plan for loom::sgd: the run uses momentum (sgd::options::momentum > 0), so
/// the state holds a momentum buffer. Without it the plan counts SGD's defaults: no state.
struct with_momentum {};

namespace diagnostic {
/// Rank Rank (its stage or slice) needs NeededBytes at loom::max_batch<Batch>, more than
/// loom::memory_budget<BudgetBytes>; batches up to LargestBatchThatFits fit (0: none does,
/// the fixed bytes alone are over).
template <std::size_t Rank, std::size_t Batch, std::size_t NeededBytes, std::size_t BudgetBytes,
          std::size_t LargestBatchThatFits>
struct memory_budget_exceeded_on_rank;
/// loom::memory_budget<BudgetBytes> without the loom::max_batch<N> to check it at.
template <std::size_t BudgetBytes>
struct memory_budget_without_max_batch;
/// Option is not one of memory_plan's options.
template <class Option>
struct not_a_memory_plan_option;
/// loom::with_momentum given for Optimizer, which has no momentum option.
template <class Optimizer>
struct with_momentum_for_an_optimizer_without_momentum;
}  // namespace diagnostic

// ---- What one rank holds -------------------------------------------------------------------------

/// The planned bytes of one rank's loom buffers (loom::host_memory counts the same buffers).
/// Fixed parts do not depend on the batch; the *_per_sample parts are bytes per sample of a
/// micro-batch (the replica's whole share of the batch when there is no pipeline), at the
/// schedule's peak: a pipeline stage keeps live_micro_batches of them at once, so those parts
/// are already multiplied by it. input_bytes_per_sample is per sample of the global batch.
struct rank_memory {
  /// The rank's place in its model-parallel group: its pipeline stage or tensor slice (0 else).
  std::size_t rank = 0;
  std::size_t parameter_bytes = 0;
  /// The model's buffers (batch norm's running statistics): the network's flat buffer of
  /// buffers, or the stage's part of it.
  std::size_t buffer_bytes = 0;
  std::size_t gradient_bytes = 0;
  std::size_t optimizer_state_bytes = 0;
  /// Buffers loom holds for communication that do not grow with the batch (a column_parallel
  /// layer's bias for an output it gathers); gradient allreduces run in place: 0.
  std::size_t communication_bytes = 0;
  /// Scratch that does not grow with the batch: a convolution's weights and weight gradient
  /// in the blocked layout oneDNN computes in (see docs/memory-plan.md).
  std::size_t workspace_bytes = 0;
  /// What forward keeps for backward: every layer's output (a ReLU fused into the layer before
  /// it has none), layer_norm's mean and 1/std, and a stage's received input.
  std::size_t activation_bytes_per_sample = 0;
  /// A pipeline stage's message buffers: the gradient it receives and the one it sends back.
  std::size_t communication_bytes_per_sample = 0;
  /// Backward's two input-gradient buffers, the loss gradient and workspace, and layout
  /// conversions between oneDNN's blocked layouts and plain ones (a convolution's input, a
  /// flatten or layer_norm after a convolution).
  std::size_t workspace_bytes_per_sample = 0;
  /// The trainer's copy of the batch: samples (first stage) and labels (last stage), per
  /// sample of the global batch.
  std::size_t input_bytes_per_sample = 0;
  /// Micro-batches of the step, and the most a stage holds at once (1 and 1 without pipeline).
  std::size_t micro_batches = 1;
  std::size_t live_micro_batches = 1;
  /// Under loom::shard_optimizer_state (ZeRO stage 1) the optimizer state is laid out as this
  /// rank's shard of the parameters, not counted in optimizer_state_bytes: its bytes per value
  /// of the shard (shard_state_bytes_per_value), and those of every buffer the shard has — the
  /// state, the shard's reduced gradients, and under compress<> their 16-bit copy
  /// (shard_bytes_per_value). shard_buckets: the buckets the shard
  /// takes a slice of each. All 0 without sharding.
  std::size_t shard_state_bytes_per_value = 0, shard_bytes_per_value = 0, shard_buckets = 0;

  /// Values of the largest shard over `replicas` replicas: at most ceil(c / replicas) of each
  /// bucket of c values (exactly that with one bucket); every value with one replica.
  constexpr std::size_t shard_values(std::size_t replicas) const noexcept {
    const std::size_t r = replicas ? replicas : 1, p = parameter_bytes / sizeof(float);
    return (p + shard_buckets * (r - 1)) / r;
  }
  /// The optimizer state's bytes on this rank over `replicas` replicas (the same on any number
  /// without sharding).
  constexpr std::size_t optimizer_state_bytes_on(std::size_t replicas) const noexcept {
    return optimizer_state_bytes + shard_state_bytes_per_value * shard_values(replicas);
  }
  /// The bytes of the sharded buffers on this rank over `replicas` replicas (0 without sharding).
  constexpr std::size_t sharded_bytes(std::size_t replicas) const noexcept {
    return shard_bytes_per_value * shard_values(replicas);
  }

  /// Everything that does not grow with the batch, but the sharded buffers (sharded_bytes).
  constexpr std::size_t fixed_bytes() const noexcept {
    return parameter_bytes + buffer_bytes + gradient_bytes + optimizer_state_bytes + communication_bytes + workspace_bytes;
  }
  /// Bytes per sample of a micro-batch, at the peak.
  constexpr std::size_t micro_batch_bytes_per_sample() const noexcept {
    return activation_bytes_per_sample + communication_bytes_per_sample + workspace_bytes_per_sample;
  }
  /// The rank's bytes when its replica, one of `replicas`, trains on `share` samples of each
  /// global batch of `global_batch`: micro-batches of ceil(share / micro_batches), the largest
  /// of a step, which every buffer grows to; the trainer's batch buffers have room for the whole
  /// global batch (loom::trainer reserves them so on every rank); the largest shard when sharded.
  constexpr std::size_t bytes_at(std::size_t share, std::size_t global_batch, std::size_t replicas = 1) const noexcept {
    const std::size_t micro = (share + micro_batches - 1) / micro_batches;
    return fixed_bytes() + sharded_bytes(replicas) + micro * micro_batch_bytes_per_sample() +
           global_batch * input_bytes_per_sample;
  }
  /// The rank's bytes for global batches of `batch` over `replicas` data-parallel replicas, at
  /// the largest share, ceil(batch / replicas) (the loader's shares differ by at most one).
  constexpr std::size_t bytes(std::size_t batch, std::size_t replicas = 1) const noexcept {
    return bytes_at(replicas <= 1 ? batch : (batch + replicas - 1) / replicas, batch, replicas);
  }
  /// The largest global batch whose bytes(batch) is at most budget on one replica, where a
  /// rank needs the most (0: not even one sample fits).
  constexpr std::size_t largest_batch_within(std::size_t budget) const noexcept {
    if (bytes(1) > budget) return 0;
    std::size_t lo = 1, hi = 2;
    while (bytes(hi) <= budget && hi < (std::size_t{1} << 48)) lo = hi, hi *= 2;
    while (hi - lo > 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      (bytes(mid) <= budget ? lo : hi) = mid;
    }
    return lo;
  }
  friend constexpr bool operator==(const rank_memory&, const rank_memory&) = default;
};

namespace detail {

// ---- The buffers of a layer list, in scalars -----------------------------------------------------

/// The backend the plan is for: the trainer's default, where pipelines run. A template of a type
/// it ignores, so that the plan's code names loom::cpu only once a plan is instantiated: in
/// code nvcc compiles, loom::cpu is only declared.
template <class Dependent>
struct plan_backend {
  using type = cpu;
};

/// What loom::sequence allocates over Chain on the plan's backend (loom/nn/describe.hpp: each
/// layer's own footprint and layout effect, its output, backward's gradient buffers).
template <class Chain>
constexpr sequence_elements elements_of_chain(bool needs_input_gradient, bool accumulates) {
  return elements_of_sequence<Chain, typename plan_backend<Chain>::type>(
      {.input_blocked = false, .needs_input_gradient = needs_input_gradient, .accumulates = accumulates});
}

/// The loss's per-sample workspace (loom::loss_workspace: each sample's loss and whether it is
/// right), and the trainer's batch: samples as float, labels as std::int32_t.
template <class Dependent>
constexpr std::size_t loss_bytes_per_sample() {
  using workspace = loss_workspace<typename plan_backend<Dependent>::type>;
  return sizeof(typename decltype(workspace::per_sample)::value_type) +
         sizeof(typename decltype(workspace::correct)::value_type);
}
inline constexpr std::size_t label_bytes = sizeof(std::int32_t);
inline constexpr std::size_t scalar_bytes = sizeof(float);

/// A rank of replica_engine (single_process, data_parallel, a tensor slice): the model's
/// parameters and gradients, its sequence, the loss gradient (dy_) and workspace, the plain
/// copy of a blocked output and of its gradient (loom::model), the trainer's batch.
template <class RankNetwork>
constexpr rank_memory replica_rank(std::size_t rank, std::size_t state_values) {
  constexpr sequence_elements e = elements_of_chain<typename RankNetwork::chain>(false, false);
  constexpr std::size_t in = RankNetwork::input_shape::size, out = RankNetwork::output_shape::size;
  constexpr std::size_t p = RankNetwork::parameter_count * scalar_bytes;
  rank_memory m;
  m.rank = rank;
  m.parameter_bytes = p;
  m.buffer_bytes = RankNetwork::buffer_count * scalar_bytes;
  m.gradient_bytes = p;
  m.optimizer_state_bytes = state_values * p;
  m.communication_bytes = e.fixed_comm * scalar_bytes;
  m.workspace_bytes = e.fixed_scratch * scalar_bytes;
  m.activation_bytes_per_sample = e.saved * scalar_bytes;
  m.workspace_bytes_per_sample =
      (e.scratch + out + (e.output_blocked ? 2 * out : 0)) * scalar_bytes + loss_bytes_per_sample<RankNetwork>();
  m.input_bytes_per_sample = in * scalar_bytes + label_bytes;
  return m;
}

/// Stage S of a pipeline (pipeline_stages): the stage model's parameters and gradients, and
/// one activation slot per live micro-batch, each with its own sequence, the received input and
/// the input gradient sent back (stages after the first), the received output gradient, and
/// the plain copies of a blocked output; the loss workspace on the last stage; the trainer's
/// samples on the first stage and labels on the last.
template <class Network, class Pipeline, std::size_t S>
constexpr rank_memory stage_rank(std::size_t state_values) {
  using part = stage_partition<Network, Pipeline>;
  using net = typename part::template stage_network<S>;
  constexpr bool first = S == 0, last = S + 1 == Pipeline::stages;
  constexpr std::size_t M = Pipeline::micro_batch_count;
  constexpr std::size_t live = Pipeline::schedule::peak_live_activations(S);
  // With several micro-batches, every backward after a step's first adds to the gradients.
  constexpr sequence_elements e = elements_of_chain<typename net::chain>(!first, M > 1);
  constexpr std::size_t in = net::input_shape::size, out = net::output_shape::size;
  constexpr std::size_t p = part::parameter_counts[S] * scalar_bytes;
  rank_memory m;
  m.rank = S;
  m.parameter_bytes = p;
  m.buffer_bytes = net::buffer_count * scalar_bytes;
  m.gradient_bytes = p;
  m.optimizer_state_bytes = state_values * p;
  m.communication_bytes = live * e.fixed_comm * scalar_bytes;
  m.workspace_bytes = live * e.fixed_scratch * scalar_bytes;
  m.activation_bytes_per_sample = live * ((first ? 0 : in) + e.saved) * scalar_bytes;
  m.communication_bytes_per_sample = live * (out + (first ? 0 : in)) * scalar_bytes;
  m.workspace_bytes_per_sample =
      live * (e.scratch + (e.output_blocked ? 2 * out : 0)) * scalar_bytes + (last ? loss_bytes_per_sample<net>() : 0);
  m.input_bytes_per_sample = (first ? Network::input_shape::size * scalar_bytes : 0) + (last ? label_bytes : 0);
  m.micro_batches = M;
  m.live_micro_batches = live;
  return m;
}

// ---- The policies -------------------------------------------------------------------------------

/// What a policy makes of a network, for the plan and the world sizes: G ranks per model
/// replica (a pipeline's stages, a tensor group's width, else 1); whether replicas multiply the
/// world (data parallelism); whether the split-invariant mode runs; each rank's buffers.
template <class Network, class Policy>
struct policy_facts {
  static constexpr bool known = false;
  static constexpr std::size_t group = 1;
  static constexpr bool replicated = false;
  static constexpr bool deterministic = false;
  static constexpr bool network_fits = false;
  static constexpr std::size_t largest_bucket_bytes = 0;
  static constexpr std::array<rank_memory, 1> ranks(std::size_t) { return {}; }
};

template <class Network, class RankNetwork, std::size_t G>
struct replica_facts {
  static constexpr bool known = true;
  static constexpr std::size_t group = G;
  static constexpr bool network_fits = RankNetwork::chain::ok;
  static constexpr std::array<rank_memory, G> ranks(std::size_t state_values) {
    std::array<rank_memory, G> r{};
    for (std::size_t i = 0; i < G; ++i) r[i] = replica_rank<RankNetwork>(i, state_values);
    return r;
  }
};

template <class Net, std::size_t CapBytes>
constexpr std::size_t largest_bucket_of() {
  using plan = bucket_plan<Net, float, CapBytes>;
  std::size_t m = 0;
  for (const auto& b : plan::buckets) m = std::max(m, b.count * scalar_bytes);
  return m;
}

template <class Network>
struct policy_facts<Network, single_process> : replica_facts<Network, Network, 1> {
  static constexpr bool replicated = false;
  static constexpr bool deterministic = true;
  static constexpr std::size_t largest_bucket_bytes = 0;
};

/// Bytes of the 16-bit copy of the gradients that loom::compress<> reduces (0 without it).
template <class DataParallel, class RankNetwork>
inline constexpr std::size_t wire_bytes_of =
    std::is_void_v<typename DataParallel::wire_type> ? 0 : RankNetwork::parameter_count * 2;

/// The data-parallel buffers of a rank that holds RankNetwork (the whole network, or a
/// tensor slice) under DataParallel: the 16-bit copy of compress<>, and under
/// shard_optimizer_state (ZeRO) the state and the reduced gradients of the shard (and the
/// reduced values' 16-bit copy under compress<>), each one value per value of the shard.
/// loom's optimizers step the shard's parameters where they lie (step_part): no copy of them.
template <class RankNetwork, class DataParallel>
constexpr void add_data_parallel_buffers(rank_memory& m, std::size_t state_values) {
  constexpr std::size_t wire = wire_bytes_of<DataParallel, RankNetwork>;
  m.communication_bytes += wire;
  if constexpr (DataParallel::shards_state) {
    m.optimizer_state_bytes = 0;
    m.shard_state_bytes_per_value = state_values * scalar_bytes;
    m.shard_bytes_per_value = (state_values + 1) * scalar_bytes + (wire ? 2 : 0);
    m.shard_buckets = bucket_plan<RankNetwork, float, DataParallel::bucket_cap_bytes>::count;
  }
}

template <class Network, class Comm, class... O>
struct policy_facts<Network, data_parallel<Comm, O...>> : replica_facts<Network, Network, 1> {
  static constexpr bool replicated = true;
  static constexpr std::size_t wire = wire_bytes_of<data_parallel<Comm, O...>, Network>;
  static constexpr bool deterministic = wire == 0;  // the split-invariant mode refuses compression
  static constexpr std::size_t largest_bucket_bytes =
      largest_bucket_of<Network, data_parallel<Comm, O...>::bucket_cap_bytes>();
  static constexpr std::array<rank_memory, 1> ranks(std::size_t state_values) {
    auto r = replica_facts<Network, Network, 1>::ranks(state_values);
    add_data_parallel_buffers<Network, data_parallel<Comm, O...>>(r[0], state_values);
    return r;
  }
};

template <class Network, std::size_t W, class Comm>
struct policy_facts<Network, model_parallel<tensor_parallel<W>, Comm>>
    : replica_facts<Network, tensor_parallel_network<Network, W>, W> {
  static constexpr bool replicated = false;
  static constexpr bool deterministic = false;
  static constexpr std::size_t largest_bucket_bytes = 0;
};

template <class Network, class Comm, class... O, std::size_t W>
struct policy_facts<Network, hybrid<data_parallel<Comm, O...>, tensor_parallel<W>>>
    : replica_facts<Network, tensor_parallel_network<Network, W>, W> {
  static constexpr bool replicated = true;
  static constexpr bool deterministic = false;
  static constexpr std::size_t largest_bucket_bytes =
      largest_bucket_of<tensor_parallel_network<Network, W>, data_parallel<Comm, O...>::bucket_cap_bytes>();
  static constexpr std::array<rank_memory, W> ranks(std::size_t state_values) {
    auto r = replica_facts<Network, tensor_parallel_network<Network, W>, W>::ranks(state_values);
    for (auto& m : r) add_data_parallel_buffers<tensor_parallel_network<Network, W>, data_parallel<Comm, O...>>(m, state_values);
    return r;
  }
};

template <class Network, class Pipeline>
struct pipeline_facts {
  using part = stage_partition<Network, Pipeline>;
  static constexpr bool known = true;
  static constexpr std::size_t group = Pipeline::stages;
  static constexpr bool deterministic = false;
  static constexpr bool network_fits = Pipeline::ok && part::ok;
  static constexpr std::array<rank_memory, group> ranks(std::size_t state_values) {
    if constexpr (!network_fits) {
      return {};
    } else {
      return [&]<std::size_t... S>(std::index_sequence<S...>) {
        return std::array<rank_memory, group>{stage_rank<Network, Pipeline, S>(state_values)...};
      }(std::make_index_sequence<group>{});
    }
  }
  template <std::size_t CapBytes>
  static constexpr std::size_t largest_bucket() {
    if constexpr (!network_fits) {
      return 0;
    } else {
      return []<std::size_t... S>(std::index_sequence<S...>) {
        return std::max({largest_bucket_of<typename part::template stage_network<S>, CapBytes>()...});
      }(std::make_index_sequence<group>{});
    }
  }
};

template <class Network, std::size_t S, class... PO, class Comm>
struct policy_facts<Network, model_parallel<pipeline<S, PO...>, Comm>> : pipeline_facts<Network, pipeline<S, PO...>> {
  static constexpr bool replicated = false;
  static constexpr std::size_t largest_bucket_bytes = 0;
};

template <class Network, class Comm, class... O, std::size_t S, class... PO>
struct policy_facts<Network, hybrid<data_parallel<Comm, O...>, pipeline<S, PO...>>>
    : pipeline_facts<Network, pipeline<S, PO...>> {
  static constexpr bool replicated = true;
  static constexpr std::size_t largest_bucket_bytes =
      pipeline_facts<Network, pipeline<S, PO...>>::template largest_bucket<data_parallel<Comm, O...>::bucket_cap_bytes>();
  using base = pipeline_facts<Network, pipeline<S, PO...>>;
  static constexpr std::array<rank_memory, S> ranks(std::size_t state_values) {
    auto r = base::ranks(state_values);
    if constexpr (base::network_fits) {
      // Each stage's data-parallel buffers over the stage's replicas, as data_parallel's over the
      // whole network: under ZeRO a rank holds the state and reduced gradients of its stage's shard.
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (add_data_parallel_buffers<typename base::part::template stage_network<I>, data_parallel<Comm, O...>>(r[I], state_values),
         ...);
      }(std::make_index_sequence<S>{});
    }
    return r;
  }
};

// ---- memory_plan's options ----------------------------------------------------------------------

template <class T>
inline constexpr bool is_memory_budget_v = false;
template <std::size_t B>
inline constexpr bool is_memory_budget_v<memory_budget<B>> = true;
template <class T>
inline constexpr bool is_max_batch_v = false;
template <std::size_t N>
inline constexpr bool is_max_batch_v<max_batch<N>> = true;
template <class T>
inline constexpr bool is_memory_plan_option_v = is_memory_budget_v<T> || is_max_batch_v<T> || std::is_same_v<T, with_momentum>;

template <class O>
constexpr std::size_t budget_in() {
  if constexpr (is_memory_budget_v<O>) return O::bytes;
  else return 0;
}
template <class O>
constexpr std::size_t max_batch_in() {
  if constexpr (is_max_batch_v<O>) return O::samples;
  else return 0;
}
template <class... O>
constexpr std::size_t budget_of() {
  return std::max({std::size_t{0}, budget_in<O>()...});
}
template <class... O>
constexpr std::size_t max_batch_of() {
  return std::max({std::size_t{0}, max_batch_in<O>()...});
}

template <class Optimizer>
concept has_momentum_option = requires(typename Optimizer::options& o) { o.momentum = 0.5f; };

/// The optimizer state the plan counts: Optimizer::state_values_per_parameter of its default
/// options, or, with loom::with_momentum, of options with momentum.
template <class Optimizer, bool Momentum>
constexpr std::size_t planned_state_values() {
  typename Optimizer::options o{};
  if constexpr (Momentum && has_momentum_option<Optimizer>) o.momentum = 0.5f;  // any value > 0: the buffer exists
  return Optimizer::state_values_per_parameter(o);
}

/// memory_plan's checks, in order, each a sentence and a marker; the budget only when the rest
/// is sound, so that one mistake is one report.
template <class Network, class Optimizer, class Policy, class... Options>
constexpr bool check_memory_plan() {
  using facts = policy_facts<Network, Policy>;
  constexpr std::size_t unknown = [] {
    std::size_t k = 0;
    bool found = false;
    ((found = found || !is_memory_plan_option_v<Options>, k += found ? 0 : 1), ...);
    return k;
  }();
  constexpr bool momentum = (std::is_same_v<Options, with_momentum> || ...);
  constexpr std::size_t most_given = std::max({std::size_t{0}, (std::size_t{0} + ... + (is_memory_budget_v<Options> ? 1 : 0)),
                                               (std::size_t{0} + ... + (is_max_batch_v<Options> ? 1 : 0)),
                                               (std::size_t{0} + ... + (std::is_same_v<Options, with_momentum> ? 1 : 0))});
  if constexpr (!is_network_v<Network>) {
    static_assert(is_network_v<Network>,
                  "loom::memory_plan<Network, Optimizer, Policy, ...>: Network must be a loom::network<loom::input<...>, "
                  "layers...>");
    return false;
  } else if constexpr (!facts::known) {
    static_assert(facts::known,
                  "loom::memory_plan<Network, Optimizer, Policy, ...>: Policy must be one of the trainer's: "
                  "loom::single_process, loom::data_parallel<Comm, ...>, loom::model_parallel<loom::pipeline<S, ...>, "
                  "Comm>, loom::model_parallel<loom::tensor_parallel<T>, Comm>, or loom::hybrid<loom::data_parallel<Comm, "
                  "...>, loom::pipeline<S, ...> or loom::tensor_parallel<T>>");
    return false;
  } else if constexpr (!requires { Optimizer::state_values_per_parameter(typename Optimizer::options{}); }) {
    static_assert(requires { Optimizer::state_values_per_parameter(typename Optimizer::options{}); },
                  "loom::memory_plan<Network, Optimizer, ...>: Optimizer must say how much state it keeps per parameter "
                  "(static constexpr std::size_t state_values_per_parameter(const options&), as loom::sgd, loom::adam "
                  "and loom::adamw do)");
    return false;
  } else if constexpr (unknown < sizeof...(Options)) {
    using option = at<unknown, type_list<Options...>>;
    static_assert(is_memory_plan_option_v<option>,
                  "loom::memory_plan<Network, Optimizer, Policy, Options...>: an option is not one of memory_plan's "
                  "(loom::memory_budget<Bytes>, loom::max_batch<N>, loom::with_momentum); its name is in the "
                  "loom::diagnostic:: name the compiler prints");
    return fail_with<diagnostic::not_a_memory_plan_option<option>>();
  } else if constexpr (most_given > 1) {
    static_assert(most_given <= 1,
                  "loom::memory_plan: an option is given more than once (loom::memory_budget, loom::max_batch or "
                  "loom::with_momentum); keep one");
    return false;
  } else if constexpr (momentum && !has_momentum_option<Optimizer>) {
    static_assert(!momentum,
                  "loom::memory_plan: loom::with_momentum is for an optimizer with a momentum option (loom::sgd); this "
                  "one's state does not depend on it (the optimizer is in the loom::diagnostic:: name the compiler "
                  "prints)");
    return fail_with<diagnostic::with_momentum_for_an_optimizer_without_momentum<Optimizer>>();
  } else if constexpr (budget_of<Options...>() > 0 && max_batch_of<Options...>() == 0) {
    static_assert(budget_of<Options...>() == 0,
                  "loom::memory_plan: loom::memory_budget<Bytes> is checked at a batch: add loom::max_batch<N>, the "
                  "largest global batch of the job");
    return fail_with<diagnostic::memory_budget_without_max_batch<budget_of<Options...>()>>();
  } else {
    return true;
  }
}

/// The first rank over Budget at Batch samples (ranks.size() when none is).
template <std::size_t G>
constexpr std::size_t first_rank_over(const std::array<rank_memory, G>& ranks, std::size_t batch, std::size_t budget) {
  for (std::size_t r = 0; r < G; ++r)
    if (ranks[r].bytes(batch) > budget) return r;
  return G;
}

/// The budget's check (after check_memory_plan): the first rank that does not fit stops the
/// compiler with a sentence, the comparison of its bytes with the budget, and the marker.
template <auto Ranks, std::size_t Batch, std::size_t Budget>
constexpr bool check_budget() {
  if constexpr (Budget == 0) {
    return true;
  } else {
    constexpr std::size_t G = Ranks.size();
    constexpr std::size_t bad = first_rank_over(Ranks, Batch, Budget);
    if constexpr (bad < G) {
      constexpr std::size_t needed = Ranks[bad].bytes(Batch);
      static_assert(needed <= Budget,
                    "loom::memory_plan: at loom::max_batch<N> a rank needs more bytes than loom::memory_budget<Bytes> "
                    "allows: train on a smaller batch (the largest that fits is the marker's last number), split the "
                    "model over more ranks, or raise the budget (the rank, the batch, the bytes it needs, the budget "
                    "and the largest batch that fits are in the loom::diagnostic:: name the compiler prints)");
      return fail_with<diagnostic::memory_budget_exceeded_on_rank<bad, Batch, needed, Budget,
                                                                    Ranks[bad].largest_batch_within(Budget)>>();
    } else {
      return true;
    }
  }
}

}  // namespace detail

// ---- The plan -----------------------------------------------------------------------------------

/// The memory one rank of a job needs, known to the compiler: Network trained with Optimizer
/// under Policy (any of the trainer's policies) on loom::cpu, in float. Options, in any order:
/// loom::with_momentum (SGD with momentum), loom::memory_budget<Bytes> with loom::max_batch<N>.
///
/// The figures are loom's buffers (what loom::host_memory() counts), taken from the code that
/// allocates them; each value below is the largest over the ranks of one model replica (its
/// stages or slices), for_rank(r) gives rank r's. See docs/memory-plan.md for what is left out.
template <class Network, class Optimizer, class Policy = single_process, class... Options>
struct memory_plan {
 private:
  using facts = detail::policy_facts<Network, Policy>;
  static constexpr bool sound = detail::check_memory_plan<Network, Optimizer, Policy, Options...>();

  template <class F>
  static constexpr std::size_t largest(F f) {
    std::size_t m = 0;
    for (const rank_memory& r : ranks) m = std::max(m, f(r));
    return m;
  }

 public:
  /// Ranks of one model replica: a pipeline's stages, a tensor group's width, 1 otherwise.
  static constexpr std::size_t ranks_per_replica = facts::group;
  /// Values of optimizer state per parameter the plan counts (see counts_state_of).
  static constexpr std::size_t state_values_per_parameter = [] {
    if constexpr (sound) return detail::planned_state_values<Optimizer, (std::is_same_v<Options, with_momentum> || ...)>();
    else return std::size_t{0};
  }();
  /// Each rank of a replica, by its stage or slice.
  static constexpr std::array<rank_memory, facts::group> ranks = [] {
    if constexpr (sound && facts::network_fits) return facts::ranks(state_values_per_parameter);
    else return std::array<rank_memory, facts::group>{};
  }();

  /// World rank r's plan (under loom::hybrid, its stage or slice is r % ranks_per_replica).
  static constexpr const rank_memory& for_rank(std::size_t r) noexcept { return ranks[r % ranks_per_replica]; }

  static constexpr std::size_t parameter_bytes = largest([](const rank_memory& r) { return r.parameter_bytes; });
  static constexpr std::size_t buffer_bytes = largest([](const rank_memory& r) { return r.buffer_bytes; });
  static constexpr std::size_t gradient_bytes = largest([](const rank_memory& r) { return r.gradient_bytes; });
  /// The optimizer state on one replica (all of it); optimizer_state_bytes_on(R) for R replicas,
  /// which under loom::shard_optimizer_state is about 1/R of it.
  static constexpr std::size_t optimizer_state_bytes = largest([](const rank_memory& r) { return r.optimizer_state_bytes_on(1); });
  static constexpr std::size_t optimizer_state_bytes_on(std::size_t replicas) noexcept {
    return largest([&](const rank_memory& r) { return r.optimizer_state_bytes_on(replicas); });
  }
  static constexpr std::size_t communication_bytes = largest([](const rank_memory& r) { return r.communication_bytes; });
  static constexpr std::size_t workspace_bytes = largest([](const rank_memory& r) { return r.workspace_bytes; });
  static constexpr std::size_t activation_bytes_per_sample =
      largest([](const rank_memory& r) { return r.activation_bytes_per_sample; });
  static constexpr std::size_t communication_bytes_per_sample =
      largest([](const rank_memory& r) { return r.communication_bytes_per_sample; });
  static constexpr std::size_t workspace_bytes_per_sample =
      largest([](const rank_memory& r) { return r.workspace_bytes_per_sample; });
  static constexpr std::size_t input_bytes_per_sample = largest([](const rank_memory& r) { return r.input_bytes_per_sample; });
  /// The most gradient bytes one allreduce carries (the largest bucket of the bucket plan;
  /// 0 without data parallelism). In place: loom holds no buffer for it, the MPI library may.
  static constexpr std::size_t largest_bucket_bytes = facts::largest_bucket_bytes;

  /// The bytes of the rank that needs the most when the global batch is `batch` over
  /// `replicas` data-parallel replicas (each training on ceil(batch / replicas) samples or
  /// one fewer; see rank_memory::bytes). Most with one replica.
  static constexpr std::size_t bytes_per_rank(std::size_t batch, std::size_t replicas = 1) noexcept {
    return largest([&](const rank_memory& r) { return r.bytes(batch, replicas); });
  }
  /// The stage or slice that needs the most at that batch (the first of equals).
  static constexpr std::size_t largest_rank(std::size_t batch, std::size_t replicas = 1) noexcept {
    const std::size_t most = bytes_per_rank(batch, replicas);
    for (const rank_memory& r : ranks)
      if (r.bytes(batch, replicas) == most) return r.rank;
    return 0;
  }
  /// The largest global batch with every rank within budget_bytes on one replica, where a rank
  /// needs the most (0: none).
  static constexpr std::size_t largest_batch_within(std::size_t budget_bytes) noexcept {
    std::size_t b = static_cast<std::size_t>(-1);
    for (const rank_memory& r : ranks) b = std::min(b, r.largest_batch_within(budget_bytes));
    return b;
  }

  /// Whether a run with these optimizer options keeps the state the plan counts (SGD: momentum
  /// > 0 exactly when the plan has loom::with_momentum).
  static constexpr bool counts_state_of(const typename Optimizer::options& o) noexcept {
    return Optimizer::state_values_per_parameter(o) == state_values_per_parameter;
  }

  /// The budget and the batch it is checked at (max_batch<N>'s N), 0 and 0 without memory_budget.
  static constexpr std::size_t budget_bytes = detail::budget_of<Options...>();
  static constexpr std::size_t budget_batch = detail::max_batch_of<Options...>();
  /// Whether the plan is sound and every rank fits the budget at budget_batch (if not, a
  /// static_assert has said why).
  static constexpr bool ok = sound && facts::network_fits && detail::check_budget<ranks, budget_batch, budget_bytes>();

 private:
  using checked_ = std::bool_constant<ok>;  // reports a problem as soon as the plan is used
};

/// World rank r's plan for a run whose optimizer options are known only at run time (the
/// trainer's): memory_plan<Network, Optimizer, Policy>'s, with the optimizer state counted from
/// `options` (SGD's momentum buffer exactly when options.momentum > 0).
template <class Network, class Optimizer, class Policy = single_process>
constexpr rank_memory rank_memory_for(const typename Optimizer::options& options, std::size_t world_rank) noexcept {
  rank_memory m = memory_plan<Network, Optimizer, Policy>::for_rank(world_rank);
  const std::size_t state = Optimizer::state_values_per_parameter(options);
  if (m.shard_bytes_per_value > 0) {  // ZeRO: the state is a shard's
    m.shard_bytes_per_value = m.shard_bytes_per_value - m.shard_state_bytes_per_value + state * sizeof(float);
    m.shard_state_bytes_per_value = state * sizeof(float);
  } else {
    m.optimizer_state_bytes = state * m.parameter_bytes;
  }
  return m;
}

}  // namespace loom
