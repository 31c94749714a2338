// SPDX-License-Identifier: Apache-2.0
#pragma once
// One rank's pipeline stage as it runs its schedule (detail::stage_runner): the rank grid and
// the pipeline group, the stage's model, its activation slots and the run of its table of
// forwards, backwards, sends and receives each step (and a forward-only pass for evaluation).
// loom::pipeline_stages (loom/parallel/pipeline/engine.hpp) builds the engine's surface on it;
// how a stage runs is described in docs/model-parallel.md, "How a stage runs".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/type_name.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/nn/describe.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/parallel/data/data_parallel.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/parallel/pipeline/channel.hpp"
#include "loom/parallel/pipeline/partition.hpp"
#include "loom/parallel/pipeline/policy.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/rank_grid.hpp"

namespace loom {

namespace detail {
/// Stands for "no data parallelism over the replicas" in pipeline_engine's DataParallel.
struct no_data_parallel {};

/// The first sample of micro-batch m when n samples are cut into M micro-batches: sizes
/// n m / M .. n (m + 1) / M differ by at most one (some are empty when n < M).
constexpr std::size_t micro_batch_begin(std::size_t n, std::size_t m, std::size_t M) { return n * m / M; }

/// A schedule's tables as the stages run them: data, not types, so that one pipeline_stages
/// serves every micro-batch count and schedule of a network cut into the same stages (the
/// tables themselves stay compile-time values, verified by loom::pipeline).
struct pipeline_run_table {
  std::size_t micro_batches = 1;
  std::span<const pipeline_op> ops;         // every stage's operations, stage by stage
  std::span<const std::size_t> op_begin;    // stage s's are ops[op_begin[s], op_begin[s + 1])
  std::string schedule_name;                // as the job description names it
  std::span<const pipeline_op> ops_of(std::size_t s) const { return ops.subspan(op_begin[s], op_begin[s + 1] - op_begin[s]); }

  template <class Pipeline>
  static pipeline_run_table of() {
    using table = typename Pipeline::schedule;
    return {Pipeline::micro_batch_count, std::span<const pipeline_op>(table::ops),
            std::span<const std::size_t>(table::op_begin), type_name<typename Pipeline::schedule_policy>()};
  }
};

/// The part of a pipeline that decides its stages (the stage count and the cut points): the
/// Pipeline pipeline_stages is built on, so that micro-batch counts and schedules share it.
template <class Pipeline>
struct stage_cut_of;
template <std::size_t S, class... O>
struct stage_cut_of<pipeline<S, O...>> {
  using type = std::conditional_t<(is_cut_at<O>::value || ...), pipeline<S, first_of<is_cut_at, void, O...>>, pipeline<S>>;
};

/// A pipeline's own fields of the job description: whether it is replicated (a hybrid), its
/// stages, micro-batches, schedule and cut points (`bounds`: each stage's first layer, then the
/// layer count).
inline std::string pipeline_job_fields(std::span<const std::size_t> bounds, std::size_t stages, bool replicated,
                                       const pipeline_run_table& table) {
  std::string b;
  for (std::size_t first : bounds) {
    if (!b.empty()) b += ',';
    b += std::to_string(first);
  }
  return std::string(";replicated=") + (replicated ? "yes" : "no") + ";stages=" + std::to_string(stages) +
         ";micro_batches=" + std::to_string(table.micro_batches) + ";schedule=" + table.schedule_name + ";bounds=" + b;
}

/// The activation slots of one stage: one per micro-batch alive at once (forwarded, backward
/// not yet run), created on demand and reused, each holding what the stage's forward keeps for
/// backward (its input when received from the previous stage, each layer's output) plus the
/// gradients passing through, and the sends still in flight out of its buffers. Slots only
/// grow (to the largest micro-batch, or evaluate's batch, seen); held_bytes() counts the saved
/// activations they hold, peak_bytes() the most at once. Seq: the stage's loom::sequence.
template <class T, class Backend, class Seq, std::size_t InSize, std::size_t OutSize, std::size_t SavedPerSample,
          bool First, class Request>
class activation_slots {
  using space = typename Backend::memory_space;

 public:
  /// One micro-batch's activations and the gradients passing through its backward.
  struct slot {
    explicit slot(std::size_t first_layer) : seq(0, first_layer) {}
    Seq seq;
    typename Backend::layout_converter conv;
    buffer<T, space> input;      // (n, InSize): received from the previous stage
    buffer<T, space> dy;         // (n, OutSize): the output's gradient, plain
    buffer<T, space> dy_layout;  // (n, OutSize): the same in the output's layout, when not plain
    buffer<T, space> dx;         // (n, InSize): the input's gradient, sent to the previous stage
    const T* x = nullptr;        // the forward's input
    const T* y = nullptr;        // the forward's output, plain
    typename Backend::format y_format{};
    std::size_t n = 0, capacity = 0;
    bool busy = false;
    std::vector<Request> sends;  // pending sends out of this slot's buffers
  };

  /// Slots for `micro_batches` micro-batches of a stage whose first layer is `first_layer`.
  activation_slots(std::size_t micro_batches, std::size_t first_layer)
      : slot_of_(micro_batches, none), first_layer_(first_layer) {}

  /// A free slot for micro-batch m (m >= micro_batches: evaluation's, not recorded) of n
  /// samples: a free one (its pending sends completed first by wait_all), or a new one when
  /// every slot holds a live micro-batch.
  /// `buffers`: the stage model's buffers (running statistics), which a new slot's layers are
  /// bound to: every micro-batch's forward in training moves them, one after another.
  template <class WaitAll>
  slot& acquire(std::size_t m, std::size_t n, WaitAll&& wait_all, T* buffers) {
    slot* s = nullptr;
    std::size_t index = 0;
    for (; index < slots_.size(); ++index)
      if (!slots_[index]->busy) {
        s = slots_[index].get();
        break;
      }
    if (s == nullptr) {
      slots_.push_back(std::make_unique<slot>(first_layer_));
      s = slots_.back().get();
      s->seq.bind_buffers(buffers);
    }
    wait_all(s->sends);
    s->busy = true;
    s->n = n;
    if (n > s->capacity) {
      if constexpr (!First) {
        s->input.reserve_discard(n * InSize);
        s->dx.reserve_discard(n * InSize);
      }
      s->dy.reserve_discard(n * OutSize);
      held_bytes_ += (n - s->capacity) * SavedPerSample * sizeof(T);
      peak_bytes_ = std::max(peak_bytes_, held_bytes_);
      s->capacity = n;
    }
    if (m < slot_of_.size()) slot_of_[m] = index;
    return *s;
  }
  /// The slot of micro-batch m (its forward ran). `stage`: for the message.
  slot& of(std::size_t m, std::size_t stage) {
    const std::size_t i = slot_of_[m];
    if (i == none)
      throw invalid_argument("loom::pipeline: internal error: stage " + std::to_string(stage) +
                             " has no activations of micro-batch " + std::to_string(m) +
                             " (the schedule runs its backward before its forward)");
    return *slots_[i];
  }
  /// Micro-batch m is done here: its slot is free once its sends complete.
  void release(std::size_t m) {
    slots_[slot_of_[m]]->busy = false;
    slot_of_[m] = none;
  }
  template <class WaitAll>
  void complete_sends(WaitAll&& wait_all) {
    for (auto& s : slots_) wait_all(s->sends);
  }
  /// After a recovery: leaks the slots, whose abandoned sends and receives may still read or
  /// write them.
  void abandon() {
    static auto* abandoned = new std::vector<std::unique_ptr<slot>>();
    for (auto& sl : slots_) abandoned->push_back(std::move(sl));
    slots_.clear();
    std::fill(slot_of_.begin(), slot_of_.end(), none);
    held_bytes_ = 0;
  }
  std::size_t peak_bytes() const noexcept { return peak_bytes_; }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::unique_ptr<slot>> slots_;  // stable addresses: requests point into them
  std::vector<std::size_t> slot_of_;          // (micro_batches): each micro-batch's slot
  std::size_t first_layer_;
  std::size_t held_bytes_ = 0, peak_bytes_ = 0;
};

/// One rank's stage of Network cut by Pipeline over Comm, as it runs its schedule (see the file
/// comment); DataParallel is a loom::data_parallel<Comm, ...> under loom::hybrid
/// (no_data_parallel otherwise). Checks the job, builds the grid, the groups and the stage.
template <class Network, class Loss, class Backend, class Pipeline, class Comm, class DataParallel>
class stage_runner {
 public:
  using value_type = float;
  using T = value_type;
  using backend_type = Backend;
  using partition = stage_partition<Network, Pipeline>;
  static constexpr std::size_t stages = Pipeline::stages;
  static constexpr bool hybrid = !std::is_same_v<DataParallel, no_data_parallel>;
  /// ZeRO stage 1: the hybrid's data_parallel names loom::shard_optimizer_state (a hybrid
  /// fixes it at compile time: no run-time choice).
  static constexpr bool may_shard_state = hybrid && shards_state_of_v<DataParallel>;
  using request = typename Comm::request;

  /// Stage I's model type: its own network, initialised as layers bounds[I].. of the whole.
  template <std::size_t I>
  using stage_model_type = ::loom::model<typename partition::template stage_network<I>, T, Backend>;

 private:
  template <std::size_t... I>
  static auto models_of(std::index_sequence<I...>) -> std::variant<stage_model_type<I>...>;

 public:
  /// One of the stage models, the one of this rank's stage (index = stage).
  using models_type = decltype(models_of(std::make_index_sequence<stages>{}));
  /// What one micro-step (one batch of the loader) brings to this stage: the samples on the
  /// first stage, the labels on the last.
  using batch_view = loom::batch_view<T>;

  /// The pipeline's own fields of the job description (every rank must agree on them).
  std::string job_fields() const { return pipeline_job_fields(partition::bounds, stages, hybrid, table_); }

  /// Calls f(state, model) with this rank's stage (state's type knows the stage at compile time).
  template <class F>
  decltype(auto) with_stage(F&& f) {
    return std::visit(
        [&](auto& st) -> decltype(auto) {
          constexpr std::size_t s = std::remove_cvref_t<decltype(st)>::index;
          return f(st, std::get<s>(models_));
        },
        states_);
  }

 protected:
  using space = typename Backend::memory_space;

  /// What stage I holds besides its model: the activation slots and, under hybrid, the engine
  /// that averages its gradients over the replicas.
  template <std::size_t I>
  struct stage_state {
    static constexpr std::size_t index = I;
    using net = typename partition::template stage_network<I>;
    using seq_type = typename net::template sequence_type<T, Backend>;
    using in_shape = typename net::input_shape;
    using out_shape = typename net::output_shape;
    static constexpr std::size_t in_size = in_shape::size, out_size = out_shape::size;
    static constexpr bool first = I == 0, last = I + 1 == stages;
    /// Elements per sample a slot keeps for backward: the received input, the layers' outputs
    /// (a fused ReLU has none) and what the layers keep themselves (their footprint's saved:
    /// layer_norm's statistics, a batch norm's fused ReLU mask).
    static constexpr std::size_t saved_per_sample =
        (first ? 0 : in_size) + elements_of_sequence<typename net::chain, Backend>({.needs_input_gradient = !first}).saved;
    using dp_engine = std::conditional_t<hybrid, gradient_allreduce<net, T, DataParallel>, no_data_parallel>;
    static_assert(!compresses_v<dp_engine> || Backend::memory_space::host_accessible,
                  "loom::compress<>: compressed gradients are converted in host memory; this backend's gradients are "
                  "not (loom::cuda): drop compress<> for now");
    using slots_type = activation_slots<T, Backend, seq_type, in_size, out_size, saved_per_sample, first, request>;
    using slot = typename slots_type::slot;

    stage_state(std::optional<Comm> dp_comm, std::size_t micro_batches) : slots(micro_batches, partition::bounds[I]) {
      if constexpr (hybrid) dp.emplace(std::move(*dp_comm));
    }

    slots_type slots;
    std::optional<dp_engine> dp;
  };

  template <std::size_t... I>
  static auto states_of(std::index_sequence<I...>) -> std::variant<stage_state<I>...>;
  using states_type = decltype(states_of(std::make_index_sequence<stages>{}));

  /// Checks that every rank of `world` describes its job as `job` plus the pipeline's fields
  /// (detail::check_same_job), then that the world fits the grid, splits it into pipeline
  /// groups (and, under hybrid, data-parallel groups) and builds this rank's stage, initialised
  /// from seed as that part of the whole model would be. Collective over world.
  stage_runner(Comm world, std::uint64_t seed, math_mode math, const std::string& job, pipeline_run_table table)
      : table_(std::move(table)),
        grid_(checked(std::move(world), job), {.group = stages, .replicated = hybrid, .member = "stage"}, who()),
        stage_(grid_.place()),
        math_(checked_math<Backend>(math)),
        pipe_(grid_.split_group()),
        models_(make_model(static_cast<std::size_t>(stage_), seed)),
        states_(make_state()) {
    if (pipe_.size() != static_cast<int>(stages) || pipe_.rank() != stage_)
      throw communication_error("loom::pipeline: internal error: rank " + std::to_string(grid_.rank()) +
                                " expected stage " + std::to_string(stage_) + " of " + std::to_string(stages) +
                                " in its pipeline group, found rank " + std::to_string(pipe_.rank()) + " of " +
                                std::to_string(pipe_.size()));
  }


  /// Runs this stage's table on one batch: micro-step a of an accumulation group of `group`.
  /// Gradients are written (first backward of the group) or added to, scaled so that the sum
  /// over micro-batches, micro-steps and replicas is the mean over the optimizer step's
  /// samples. On the group's last micro-step, under hybrid, the data-parallel allreduce starts
  /// during the last backward and completes here. Returns the loss sums (last stage; zero
  /// elsewhere). Collective over the pipeline group (and the data-parallel group).
  template <class State, class Model>
  loss_value run_table(State& st, Model& model, const batch_view& b, std::size_t a, std::size_t group, std::uint64_t seed,
                       std::uint64_t step) {
    using enum pipeline_op_kind;
    const std::span<const pipeline_op> ops = table_.ops_of(State::index);
    const table_pass pass{.b = &b, .seed = seed, .step = step, .last_backward = last_backward_of(ops),
                          .last_of_group = a + 1 == group, .scale = T(1) / static_cast<T>(b.global_n * group)};
    loss_value total;
    std::vector<request> receives;  // posted, not yet waited for
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const pipeline_op op = ops[i];
      const std::size_t m = op.micro_batch, lo = micro_batch_begin(b.n, m, table_.micro_batches);
      const micro_batch mb{.m = m, .lo = lo, .n = micro_batch_begin(b.n, m + 1, table_.micro_batches) - lo};
      if (!is_communication(op.kind)) channel().wait_all(receives);
      switch (op.kind) {
        case recv_activation: receives.push_back(receive_activation(st, mb)); break;
        case forward: run_forward(st, model, pass, mb, total); break;
        case send_activation: send_activation_of(st, mb); break;
        case recv_gradient: receives.push_back(receive_gradient(st, mb)); break;
        case backward: run_backward(st, model, pass, mb, i == pass.last_backward); break;
        case send_gradient: send_gradient_of(st, mb); break;
      }
      if (!op.posted_with_next) channel().wait_all(receives);
    }
    channel().wait_all(receives);
    complete_sends(st);
    if (pass.last_of_group) {
      monitor::timed compute(figures_, &rank_figures::compute_s);
      if (!grads_written_) {  // no sample of this step reached this stage: contribute zeros
        Backend::zero(model.gradients().data(), model.parameters().size());
        grads_written_ = true;
      }
      compute.stop();
      if constexpr (hybrid) st.dp->finish(model.gradients().data());
    }
    return total;
  }

  /// Forward only (evaluation mode) of one batch through the stage: the loss sums on the last
  /// stage, zero elsewhere. Collective over the pipeline group.
  template <class State, class Model>
  loss_value run_evaluation(State& st, Model& model, const batch_view& b, std::uint64_t seed, std::uint64_t step) {
    const run_context ctx{.training = false, .accumulate = false, .seed = seed, .step = step, .sample_offset = b.offset,
                          .math = math_};
    auto& sl = acquire(st, table_.micro_batches, b.n);
    loss_value v;
    if constexpr (State::first) {
      sl.x = b.x;
    } else {
      sl.x = sl.input.data();
      auto r = channel().receive_evaluation(sl.input.data(), b.n * State::in_size, b.n);
      channel().wait(r);
    }
    sl.y = nullptr;
    if (b.n > 0) {
      monitor::timed compute(figures_, &rank_figures::compute_s);
      const auto y = sl.seq.forward(ctx, model.parameters().data(), activation<const T, Backend>{sl.x}, b.n);
      sl.y = sl.conv.template to_plain<T, typename State::out_shape>(y.data, y.format, b.n);
      if constexpr (State::last)
        v = Loss::template compute<Backend, State::out_size, T>(sl.y, b.labels, nullptr, b.n, T(1), ws_);
      compute.stop();
    }
    if constexpr (!State::last)
      sl.sends.push_back(channel().send_evaluation(sl.y, b.n * State::out_size, b.n));
    sl.busy = false;  // its send completes before the slot is used again
    return v;
  }

  template <class State>
  void complete_sends(State& st) {
    st.slots.complete_sends(waits());
  }

  pipeline_run_table table_;
  rank_grid<Comm> grid_;
  int stage_;
  math_mode math_;
  Comm pipe_;
  models_type models_;
  states_type states_;
  loss_workspace<Backend> ws_;
  rank_figures figures_;
  bool grads_written_ = false;
  T empty_{};  // what an empty message names (stage_channel)

 private:
  /// What one run of the table shares between its operations.
  struct table_pass {
    const batch_view* b;
    std::uint64_t seed, step;
    std::size_t last_backward;  // the index of the last backward op (its layers start the allreduce)
    bool last_of_group;
    T scale;
  };
  /// Micro-batch m: n samples from lo of this rank's share.
  struct micro_batch {
    std::size_t m, lo, n;
  };

  static std::string who() {
    return std::string("loom::trainer with ") + (hybrid ? "loom::hybrid<data_parallel, " : "loom::model_parallel<") +
           "pipeline<" + std::to_string(stages) + ">>";
  }
  Comm checked(Comm world, const std::string& job) const {
    // The job first: ranks that disagree on the pipeline hear so before any of them splits.
    check_same_job(world, "ranks=" + std::to_string(world.size()) + ";" + job + job_fields(), "loom::pipeline");
    return world;
  }
  template <std::size_t I = 0>
  static models_type make_model(std::size_t stage, std::uint64_t seed) {
    if constexpr (I + 1 < stages)
      if (stage != I) return make_model<I + 1>(stage, seed);
    return models_type(std::in_place_index<I>, seed, partition::bounds[I]);
  }
  template <std::size_t I = 0>
  static states_type make_state(std::size_t stage, std::optional<Comm>& dp_comm, std::size_t micro_batches) {
    if constexpr (I + 1 < stages)
      if (stage != I) return make_state<I + 1>(stage, dp_comm, micro_batches);
    return states_type(std::in_place_index<I>, std::move(dp_comm), micro_batches);
  }
  states_type make_state() {
    std::optional<Comm> dp_comm;
    if constexpr (hybrid) dp_comm.emplace(grid_.split_data());
    return make_state(static_cast<std::size_t>(stage_), dp_comm, table_.micro_batches);
  }

  static std::size_t last_backward_of(std::span<const pipeline_op> ops) {
    std::size_t last = 0;
    for (std::size_t k = 0; k < ops.size(); ++k)
      if (ops[k].kind == pipeline_op_kind::backward) last = k;
    return last;
  }
  run_context training_context(const table_pass& p, const micro_batch& mb) const {
    return {.training = true, .accumulate = grads_written_, .seed = p.seed, .step = p.step,
            .sample_offset = p.b->offset + mb.lo, .math = math_};
  }

  template <class State>
  request receive_activation(State& st, const micro_batch& mb) {
    auto& sl = acquire(st, mb.m, mb.n);
    sl.x = sl.input.data();
    return channel().receive(pipeline_op_kind::recv_activation, sl.input.data(), mb.n * State::in_size, mb.n, mb.m);
  }
  template <class State>
  request receive_gradient(State& st, const micro_batch& mb) {
    return channel().receive(pipeline_op_kind::recv_gradient, slot_of(st, mb.m).dy.data(), mb.n * State::out_size, mb.n,
                             mb.m);
  }
  template <class State>
  void send_activation_of(State& st, const micro_batch& mb) {
    auto& sl = slot_of(st, mb.m);
    sl.sends.push_back(channel().send(pipeline_op_kind::send_activation, sl.y, mb.n * State::out_size, mb.n, mb.m));
  }
  template <class State>
  void send_gradient_of(State& st, const micro_batch& mb) {
    auto& sl = slot_of(st, mb.m);
    sl.sends.push_back(channel().send(pipeline_op_kind::send_gradient, sl.dx.data(), mb.n * State::in_size, mb.n, mb.m));
    release(st, mb.m);
  }
  template <class State, class Model>
  void run_forward(State& st, Model& model, const table_pass& p, const micro_batch& mb, loss_value& total) {
    auto& sl = State::first ? acquire(st, mb.m, mb.n) : slot_of(st, mb.m);
    if constexpr (State::first) sl.x = p.b->x + mb.lo * State::in_size;
    sl.y = nullptr;
    if (mb.n == 0) {
      settle_stage(st);  // no samples here: nothing reads the parameters, but they must be whole
      return;
    }
    // Under ZeRO this forward may wait for the parameters' gathers: exposed communication (the
    // data-parallel figures'), taken out of the compute time.
    double exposed_before = 0;
    if constexpr (may_shard_state) exposed_before = st.dp->figures().comm_exposed_s;
    monitor::timed compute(figures_, &rank_figures::compute_s);
    monitor::span fw(monitor::span_kind::forward, static_cast<std::int32_t>(mb.m));
    const auto y = forward_awaiting_parameters(st, sl, training_context(p, mb), model.parameters().data(), mb.n);
    sl.y_format = y.format;
    sl.y = sl.conv.template to_plain<T, typename State::out_shape>(y.data, y.format, mb.n);
    if constexpr (State::last) {
      const loss_value v =
          Loss::template compute<Backend, State::out_size, T>(sl.y, p.b->labels + mb.lo, sl.dy.data(), mb.n, p.scale, ws_);
      total.sum += v.sum;
      total.correct += v.correct;
    }
    fw.stop();
    compute.stop();
    if constexpr (may_shard_state) figures_.compute_s -= st.dp->figures().comm_exposed_s - exposed_before;
  }

  template <class State, class Model>
  void run_backward(State& st, Model& model, const table_pass& p, const micro_batch& mb, bool last_backward) {
    auto& sl = slot_of(st, mb.m);
    if (mb.n > 0) {
      monitor::timed compute(figures_, &rank_figures::compute_s);
      monitor::span bw(monitor::span_kind::backward, static_cast<std::int32_t>(mb.m));
      const T* d = sl.dy.data();
      if (!sl.y_format.plain()) {
        sl.dy_layout.reserve_discard(mb.n * State::out_size);
        sl.conv.template from_plain<T, typename State::out_shape>(sl.dy.data(), sl.y_format, sl.dy_layout.data(), mb.n);
        d = sl.dy_layout.data();
      }
      T* dx = State::first ? nullptr : sl.dx.data();
      T* params = model.parameters().data();
      T* grads = model.gradients().data();
      const run_context ctx = training_context(p, mb);
      if (hybrid && p.last_of_group && last_backward) {
        sl.seq.backward(ctx, params, activation<const T, Backend>{sl.x}, d, dx, grads, [&](std::size_t layer) {
          if constexpr (hybrid) st.dp->layer_done(layer, grads);
        });
      } else {
        sl.seq.backward(ctx, params, activation<const T, Backend>{sl.x}, d, dx, grads);
      }
      grads_written_ = true;
      bw.stop();
      compute.stop();
    }
    if constexpr (State::first) release(st, mb.m);
  }

  /// A training forward of micro-batch slot sl (n samples). Under ZeRO the step's first
  /// forward may find the parameters' gathers in flight: each layer first waits for its unit's
  /// (zero_layout::gather_unit), and the rest are completed after it.
  template <class State>
  activation<T, Backend> forward_awaiting_parameters(State& st, typename State::slot& sl, const run_context& ctx,
                                                     const T* params, std::size_t n) {
    if constexpr (may_shard_state) {
      if (st.dp->gathering()) {
        const auto y = sl.seq.forward(ctx, params, activation<const T, Backend>{sl.x}, n,
                                      [&](std::size_t layer) { st.dp->await_layer(layer); });
        st.dp->settle();  // a unit of layers the forward never reached (none in a chain)
        return y;
      }
    }
    return sl.seq.forward(ctx, params, activation<const T, Backend>{sl.x}, n);
  }
  template <class State>
  void settle_stage(State& st) {
    if constexpr (may_shard_state) st.dp->settle();
  }

  /// The messages of this stage to its neighbours (see stage_channel).
  stage_channel<T, Comm> channel() { return {pipe_, figures_, empty_, stage_, table_.micro_batches}; }
  /// channel().wait_all, for the slots.
  auto waits() {
    return [this](std::vector<request>& rs) { channel().wait_all(rs); };
  }
  template <class State>
  typename State::slot& acquire(State& st, std::size_t m, std::size_t n) {
    return st.slots.acquire(m, n, waits(), std::get<State::index>(models_).buffers().data());
  }
  template <class State>
  typename State::slot& slot_of(State& st, std::size_t m) {
    return st.slots.of(m, State::index);
  }
  template <class State>
  void release(State& st, std::size_t m) {
    st.slots.release(m);
  }
};

}  // namespace detail
}  // namespace loom
