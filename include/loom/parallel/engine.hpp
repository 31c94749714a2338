// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::engine: what the one trainer (loom/train/trainer.hpp) asks of the engine of a policy.
// An engine owns this rank's model and optimizer state and runs everything between "here is
// this rank's share of a batch" and "the parameters have stepped": the passes, the loss, the
// communication of its policy, gradient clipping over the whole model and the optimizer step.
// The trainer owns the loop: epochs, batches, accumulation groups, progress, results.
//
// The engines: loom::replica_engine (single_process, data_parallel, tensor parallelism and its
// hybrid; loom/parallel/replica_engine.hpp) and loom::pipeline_engine (pipelines and their
// hybrid; loom/parallel/pipeline_engine.hpp).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/nn/loss.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom {

/// One micro-step's share of a batch for this rank, in the backend's memory.
template <class T>
struct batch_view {
  const T* x = nullptr;                  // (n, input): the samples; null where the engine reads none
  const std::int32_t* labels = nullptr;  // (n): the labels; null where the engine reads none
  std::size_t n = 0;                     // samples of this replica (this rank's share)
  std::size_t global_n = 0;              // samples of the whole batch (all replicas)
  std::size_t offset = 0;                // the first of this replica's samples within the global batch
};

/// How data parallelism sends the gradients: as they are (float), or rounded to 16 bits
/// (loom::compress<bf16>, loom::compress<fp16>).
enum class gradient_wire { native, bf16, fp16 };
/// "native", "bf16", "fp16" ("?" for a value that is none of them).
constexpr const char* to_string(gradient_wire w) noexcept {
  switch (w) {
    case gradient_wire::native: return "native";
    case gradient_wire::bf16: return "bf16";
    case gradient_wire::fp16: return "fp16";
  }
  return "?";
}

/// The options of a data_parallel policy that can also be taken at run time: the wire format
/// (gradient_wire::bf16 and fp16 as loom::compress<bf16> and compress<fp16>) and ZeRO stage 1
/// (shard_state as loom::shard_optimizer_state). A program that reads them from a flag names
/// loom::data_parallel<Comm, loom::choose_at_run_time> and hands loom::trainer one of these.
/// Inside loom, the trainers of one network, optimizer and communicator share one compiled
/// body whatever these are (detail::code_policy, loom/train/trainer.hpp): a policy that names
/// them still fixes them at compile time, and they reach that body as these values.
struct data_parallel_choice {
  gradient_wire wire = gradient_wire::native;
  bool shard_state = false;
};

/// What an engine is built from: the trainer's seed and math mode, the optimizer's options,
/// the job every rank must share (key=value fields, compared across ranks before anything
/// else is communicated), and for data parallelism the options it takes at run time.
template <class OptimizerOptions>
struct engine_setup {
  std::uint64_t seed = 1;
  math_mode math = math_mode::fp32;
  OptimizerOptions optimizer{};
  std::string job;
  data_parallel_choice data_parallel{};
};

namespace detail {
/// Whether Comm can move the memory Backend computes in: any communicator (or none, void)
/// moves host memory; GPU memory needs one that says so (nccl_comm::moves_device_memory).
template <class Comm, class Backend>
constexpr bool comm_reaches_memory_of() {
  if constexpr (std::is_void_v<Comm> || Backend::memory_space::host_accessible) return true;
  else return requires { requires Comm::moves_device_memory; };
}

/// math, when Backend can run it; otherwise throws loom::invalid_argument saying what to use.
/// Every engine checks it after the job check, so ranks that disagree hear of that first.
template <class Backend>
math_mode checked_math(math_mode math) {
  if (!Backend::supports(math))
    throw invalid_argument(std::string("loom::trainer: trainer_options::math = loom::math_mode::") + to_string(math) +
                           " is not available on loom::" + Backend::name + " here (see loom::" + Backend::name +
                           "::supports): use math_mode::fp32");
  return math;
}
}  // namespace detail

/// The engine of a policy, as the trainer drives it. E::value_type is the parameters' type.
///
/// - rank(), world(): this process in the whole world; replica(), replicas(): the data split
///   (which share of every batch this rank's replica reads: the loader's rank and ranks).
/// - reads_samples(), reads_labels(): whether this rank needs the batch's samples and labels
///   (a pipeline's first and last stages); the trainer fills only those.
/// - check_same_job(d): every rank describes the same d, or every rank throws the same
///   loom::communication_error naming the ranks and the fields that differ. Collective.
/// - prepare_fit(batch, deterministic_chunk): readies a fit of this global batch; returns the
///   block of samples the loader must keep whole per rank (0: none), throws
///   loom::invalid_argument when the engine cannot run the mode.
/// - micro_step(b, m, group, seed, step): micro-step m of an accumulation group of `group`:
///   forward, loss (gradient scaled by 1 / (b.global_n * group)), backward, and on the last one
///   the gradient communication. Returns this rank's loss sums (zero where it holds no loss).
/// - optimizer_step(lr, clip): clips the whole model's gradient norm to clip (0: none) and
///   steps the optimizer at learning rate lr.
/// - evaluate_batch(b, seed, step) and end_evaluation(): forward only; loss sums as above.
/// - sum(v, n): v[0, n) summed over the replicas, each replica counted once, on every rank
///   (ranks holding no loss contribute nothing). Collective.
/// - figures(), reset_figures(), gather_figures(): this rank's figures, and every rank's on
///   every rank (collective); gather_timelines(t, dropped): every rank's spans on world rank 0
///   (collective).
/// - shard(): what this rank holds (loom::shard_map).
/// - parameters_l2(), gather_parameters(): the whole model's norm and flat parameters on every
///   rank (collective over the model-parallel group).
template <class E>
concept engine = requires(E& e, const E& ce, const batch_view<typename E::value_type>& b, std::size_t n, std::uint64_t u,
                          double* v, const std::string& s, float lr, double clip, const monitor::timeline& t,
                          std::vector<std::size_t>& d) {
  typename E::value_type;
  { ce.rank() } -> std::same_as<int>;
  { ce.world() } -> std::same_as<int>;
  { ce.replica() } -> std::same_as<int>;
  { ce.replicas() } -> std::same_as<int>;
  { ce.reads_samples() } -> std::same_as<bool>;
  { ce.reads_labels() } -> std::same_as<bool>;
  e.check_same_job(s);
  { e.prepare_fit(n, n) } -> std::same_as<std::size_t>;
  { e.micro_step(b, n, n, u, u) } -> std::same_as<loss_value>;
  e.optimizer_step(lr, clip);
  { e.evaluate_batch(b, u, u) } -> std::same_as<loss_value>;
  e.end_evaluation();
  e.sum(v, n);
  { e.figures() } -> std::same_as<rank_figures&>;
  e.reset_figures();
  { e.gather_figures() } -> std::same_as<std::vector<rank_figures>>;
  { e.gather_timelines(t, d) } -> std::same_as<std::vector<std::vector<monitor::span_event>>>;
  { ce.flops_per_sample() } -> std::convertible_to<double>;
  { ce.shard() } -> std::same_as<shard_map>;
  { e.parameters_l2() } -> std::same_as<double>;
  { e.gather_parameters() } -> std::same_as<std::vector<typename E::value_type>>;
  e.model();
  e.optimizer();
};

namespace detail {
/// Whether X (a gradient_allreduce, or a sync holding one) sends its gradients compressed
/// (loom::compress<>, parallel/data_parallel.hpp).
template <class X>
inline constexpr bool compresses_v = [] {
  if constexpr (requires { X::compressed; }) return X::compressed;
  else return false;
}();
/// Whether X (a gradient_allreduce) shards the optimizer state (loom::shard_optimizer_state).
template <class X>
inline constexpr bool shards_state_v = [] {
  if constexpr (requires { X::sharded; }) return X::sharded;
  else return false;
}();
/// Whether X (a gradient_allreduce) may shard the optimizer state: it does (shards_state_v), or
/// it takes that choice at run time (data_parallel_choice).
template <class X>
inline constexpr bool may_shard_state_v = [] {
  if constexpr (requires { X::may_shard; }) return X::may_shard;
  else return false;
}();

/// Whether an optimizer state steps part of itself (step_part, end_step: loom's optimizers do).
template <class State, class T>
concept steps_in_place = requires(State& s, T* p, const T* g, std::size_t n, float lr) {
  s.step_part(p, g, n, n, lr);
  s.end_step();
};

/// ZeRO's step of a rank's slices (replica_engine and pipeline_stages): the blocks z.pieces of
/// params (the rank's own flat layout) stepped with their reduced gradients g (the shard,
/// z.shard_count values) and `state` (the shard's) at learning rate lr — where they lie when
/// the state steps in place, else on a contiguous copy in `copy` (sized here). Backend's
/// memory; z a loom::zero_layout.
template <class Backend, class T, class State, class ZeroLayout>
void step_zero_slices(State& state, T* params, const T* g, const ZeroLayout& z,
                      buffer<T, typename Backend::memory_space>& copy, float lr) {
  if constexpr (steps_in_place<State, T>) {
    for (const shard_piece& q : z.pieces) state.step_part(params + q.whole_offset, g + q.local_offset, q.local_offset, q.count, lr);
    state.end_step();
  } else {
    const std::size_t n = std::max<std::size_t>(1, z.shard_count);
    if (copy.size() != n) copy = buffer<T, typename Backend::memory_space>(n);
    T* p = copy.data();
    for (const shard_piece& q : z.pieces) Backend::copy(p + q.local_offset, params + q.whole_offset, q.count);
    state.step(p, g, z.shard_count, lr);
    for (const shard_piece& q : z.pieces) Backend::copy(params + q.whole_offset, p + q.local_offset, q.count);
  }
}

}  // namespace detail

}  // namespace loom
