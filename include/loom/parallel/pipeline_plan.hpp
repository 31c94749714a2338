// SPDX-License-Identifier: Apache-2.0
#pragma once
// The compile-time half of pipeline model parallelism: the policy types
// (loom::model_parallel<loom::pipeline<Stages, Options...>, Comm>), the partition of a network's
// layers into stages, and the per-stage schedule tables (GPipe, 1F1B) with the check that their
// sends and receives pair up. The run-time half, which trains with these plans, is
// loom/parallel/pipeline_engine.hpp (driven by loom::trainer, loom/train/trainer.hpp).

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "loom/core/shape.hpp"
#include "loom/core/type_list.hpp"
#include "loom/layers/layer.hpp"
#include "loom/nn/network.hpp"
#include "loom/parallel/diagnostics.hpp"
#include "loom/parallel/tensor_parallel.hpp"

namespace loom {

// ---- Policies ---------------------------------------------------------------------------------

/// Option of pipeline: each step's batch is split into M micro-batches that flow through the
/// stages one after the other (default 1: no overlap between stages at all).
template <std::size_t M>
struct micro_batches {
  static_assert(M >= 1, "loom::micro_batches<M>: a step needs at least one micro-batch");
  static constexpr std::size_t value = M;
};

/// Schedule GPipe: every stage runs the forwards of all M micro-batches, then their backwards in
/// reverse order (B(M-1) first, so the last stage starts backward on the micro-batch it has just
/// forwarded). A stage keeps the activations of all M micro-batches alive at once.
struct gpipe {};

/// Schedule 1F1B (PipeDream-Flush): stage s runs min(S - s - 1, M) warm-up forwards, then
/// alternates one forward and one backward, then the remaining backwards. Same bubble as GPipe,
/// but stage s keeps at most min(S - s, M) micro-batches of activations alive instead of M.
struct one_f_one_b {};

/// Option of pipeline: user-given cut points, the index of the first layer of stages 1 .. S-1
/// (counted from 0 after loom::input). Requires S - 1 strictly increasing points, each in
/// [1, layer_count - 1]. Without it, stages are balanced by cost (see stage_partition).
template <std::size_t... Cuts>
struct cut_at {
  static constexpr std::size_t count = sizeof...(Cuts);
  static constexpr std::array<std::size_t, sizeof...(Cuts)> points{Cuts...};
};

/// The pass of one scheduled action.
enum class pipeline_pass : unsigned char { forward, backward };

/// One entry of a stage's schedule: run `pass` of micro-batch `micro_batch` on this stage.
struct pipeline_action {
  pipeline_pass pass = pipeline_pass::forward;
  std::size_t micro_batch = 0;
  friend constexpr bool operator==(const pipeline_action&, const pipeline_action&) = default;
};

/// The forward (backward) of micro-batch m, for writing tables: forward_of(0), backward_of(0).
constexpr pipeline_action forward_of(std::size_t m) { return {pipeline_pass::forward, m}; }
constexpr pipeline_action backward_of(std::size_t m) { return {pipeline_pass::backward, m}; }

/// One stage's hand-written table, in execution order, for custom_schedule.
template <pipeline_action... Actions>
struct stage_actions {
  static constexpr std::array<pipeline_action, sizeof...(Actions)> actions{Actions...};
};

/// A hand-written schedule: one stage_actions<...> per stage, stage 0 first. It is checked like
/// the built-in ones: every stage runs each micro-batch's forward and backward exactly once, and
/// the sends and receives derived from the tables pair up without deadlock.
template <class... Stages>
struct custom_schedule {};

namespace detail {
template <class T>
struct is_micro_batches : std::false_type {};
template <std::size_t M>
struct is_micro_batches<micro_batches<M>> : std::true_type {};
template <class T>
struct is_cut_at : std::false_type {};
template <std::size_t... C>
struct is_cut_at<cut_at<C...>> : std::true_type {};
template <class T>
struct is_stage_actions : std::false_type {};
template <pipeline_action... A>
struct is_stage_actions<stage_actions<A...>> : std::true_type {};
template <class T>
struct is_schedule : std::false_type {};
template <>
struct is_schedule<gpipe> : std::true_type {};
template <>
struct is_schedule<one_f_one_b> : std::true_type {};
template <class... S>
struct is_schedule<custom_schedule<S...>> : std::true_type {};
template <class T>
struct is_pipeline_option : std::bool_constant<is_micro_batches<T>::value || is_cut_at<T>::value || is_schedule<T>::value> {};

// first_of<Is, Default, Options...> -> the first option O with Is<O>::value, else Default
template <template <class> class Is, class Default, class... Options>
struct first_of_impl {
  using type = Default;
};
template <template <class> class Is, class Default, class O, class... Rest>
struct first_of_impl<Is, Default, O, Rest...> {
  using type = std::conditional_t<Is<O>::value, O, typename first_of_impl<Is, Default, Rest...>::type>;
};
template <template <class> class Is, class Default, class... Options>
using first_of = typename first_of_impl<Is, Default, Options...>::type;

template <template <class> class Is, class... Options>
inline constexpr std::size_t count_of = (std::size_t{0} + ... + (Is<Options>::value ? 1 : 0));

/// Stands for "no cut_at given: balance automatically".
struct balanced_cuts {
  static constexpr std::size_t count = 0;
  static constexpr std::array<std::size_t, 0> points{};
};
}  // namespace detail

// ---- Schedules --------------------------------------------------------------------------------

/// One operation of a stage's run, derived from its actions: a pass, or a send or receive of one
/// micro-batch's activations (forward, between stage s and s + 1) or gradients (backward,
/// between s + 1 and s).
enum class pipeline_op_kind : unsigned char {
  recv_activation,  // from stage s - 1, before a forward
  forward,
  send_activation,  // to stage s + 1, after a forward
  recv_gradient,    // from stage s + 1, before a backward
  backward,
  send_gradient,  // to stage s - 1, after a backward
};

/// An operation of a stage's run. `action` is the index of the action it belongs to in the
/// stage's table. posted_with_next: this send or receive is posted together with the next
/// operation (one batch of non-blocking sends and receives, waited for as a whole, as
/// MPI_Sendrecv or torch's batch_isend_irecv).
struct pipeline_op {
  pipeline_op_kind kind = pipeline_op_kind::forward;
  std::size_t micro_batch = 0;
  std::size_t action = 0;
  bool posted_with_next = false;
  friend constexpr bool operator==(const pipeline_op&, const pipeline_op&) = default;
};

/// Whether op is a send or receive (not a pass).
constexpr bool is_communication(pipeline_op_kind k) {
  return k != pipeline_op_kind::forward && k != pipeline_op_kind::backward;
}
constexpr bool is_send(pipeline_op_kind k) {
  return k == pipeline_op_kind::send_activation || k == pipeline_op_kind::send_gradient;
}
/// The stage a send or receive of stage `stage` talks to.
constexpr std::size_t peer_of(pipeline_op_kind k, std::size_t stage) {
  return k == pipeline_op_kind::send_activation || k == pipeline_op_kind::recv_gradient ? stage + 1 : stage - 1;
}
/// The receive that pairs with a send (and the reverse).
constexpr pipeline_op_kind counterpart_of(pipeline_op_kind k) {
  switch (k) {
    case pipeline_op_kind::send_activation: return pipeline_op_kind::recv_activation;
    case pipeline_op_kind::recv_activation: return pipeline_op_kind::send_activation;
    case pipeline_op_kind::send_gradient: return pipeline_op_kind::recv_gradient;
    case pipeline_op_kind::recv_gradient: return pipeline_op_kind::send_gradient;
    default: return k;
  }
}

namespace detail {
/// Where a schedule's actions come from: length(s, S, M) actions on stage s, the i-th being
/// at(s, i, S, M).
template <class Schedule>
struct schedule_source;

template <>
struct schedule_source<gpipe> {
  static constexpr std::size_t given_stages(std::size_t S) { return S; }
  static constexpr std::size_t length(std::size_t, std::size_t, std::size_t M) { return 2 * M; }
  static constexpr pipeline_action at(std::size_t, std::size_t i, std::size_t, std::size_t M) {
    return i < M ? forward_of(i) : backward_of(2 * M - 1 - i);
  }
};

template <>
struct schedule_source<one_f_one_b> {
  static constexpr std::size_t given_stages(std::size_t S) { return S; }
  static constexpr std::size_t length(std::size_t, std::size_t, std::size_t M) { return 2 * M; }
  static constexpr pipeline_action at(std::size_t s, std::size_t i, std::size_t S, std::size_t M) {
    const std::size_t warmup = S - s - 1 < M ? S - s - 1 : M;
    if (i < warmup) return forward_of(i);
    const std::size_t j = i - warmup, steady = 2 * (M - warmup);
    if (j < steady) return j % 2 == 0 ? forward_of(warmup + j / 2) : backward_of(j / 2);
    return backward_of(M - warmup + (j - steady));
  }
};

template <class... Stages>
struct schedule_source<custom_schedule<Stages...>> {
  static_assert((is_stage_actions<Stages>::value && ...),
                "loom::custom_schedule<Stages...>: each stage's table must be loom::stage_actions<...>, e.g. "
                "loom::stage_actions<loom::forward_of(0), loom::backward_of(0)>");
  static constexpr std::size_t count = sizeof...(Stages);
  static constexpr std::array<std::size_t, count + 1> begin = [] {
    std::array<std::size_t, count + 1> b{};
    std::size_t s = 0;
    if constexpr ((is_stage_actions<Stages>::value && ...)) ((b[s + 1] = b[s] + Stages::actions.size(), ++s), ...);
    return b;
  }();
  static constexpr std::array<pipeline_action, begin[count]> flat = [] {
    std::array<pipeline_action, begin[count]> f{};
    std::size_t n = 0;
    if constexpr ((is_stage_actions<Stages>::value && ...))
      (([&] {
         for (const auto& a : Stages::actions) f[n++] = a;
       }()),
       ...);
    return f;
  }();
  static constexpr std::size_t given_stages(std::size_t) { return count; }
  static constexpr std::size_t length(std::size_t s, std::size_t, std::size_t) {
    return s < count ? begin[s + 1] - begin[s] : 0;
  }
  static constexpr pipeline_action at(std::size_t s, std::size_t i, std::size_t, std::size_t) { return flat[begin[s] + i]; }
};

/// Appends stage s's operations (derived from its actions) to out through emit(op) and returns
/// how many there are. Before a forward on s > 0: receive its activation from s - 1; after a
/// forward on s < S - 1: send the activation to s + 1. Before a backward on s < S - 1: receive
/// its gradient from s + 1; after a backward on s > 0: send the input gradient to s - 1. A send
/// and the receive right after it are posted together when they go to the same neighbour (the
/// steady state of 1F1B: send an activation forward and receive a gradient back at once).
template <class Source, class Emit>
constexpr std::size_t derive_ops(std::size_t s, std::size_t S, std::size_t M, Emit&& emit) {
  using enum pipeline_op_kind;
  std::size_t n = 0;
  bool last_was_send = false;
  pipeline_op last{};
  auto put = [&](pipeline_op op) {
    if (last_was_send && is_communication(op.kind) && !is_send(op.kind) && peer_of(op.kind, s) == peer_of(last.kind, s))
      last.posted_with_next = true;
    if (n > 0) emit(n - 1, last);
    last = op;
    last_was_send = is_send(op.kind);
    ++n;
  };
  const std::size_t length = Source::length(s, S, M);
  for (std::size_t i = 0; i < length; ++i) {
    const pipeline_action a = Source::at(s, i, S, M);
    const std::size_t m = a.micro_batch;
    if (a.pass == pipeline_pass::forward) {
      if (s > 0) put({recv_activation, m, i});
      put({forward, m, i});
      if (s + 1 < S) put({send_activation, m, i});
    } else {
      if (s + 1 < S) put({recv_gradient, m, i});
      put({backward, m, i});
      if (s > 0) put({send_gradient, m, i});
    }
  }
  if (n > 0) emit(n - 1, last);
  return n;
}
}  // namespace detail

/// The schedule of a pipeline of S stages running M micro-batches per step, as constexpr
/// tables: for each stage, its actions (passes) in execution order, and the operations derived
/// from them (passes, sends and receives; see detail::derive_ops for the rules). Schedule is
/// loom::gpipe, loom::one_f_one_b or a loom::custom_schedule<...>. This type only computes;
/// pairs_up<schedule_table<...>>() says whether the tables are sound, and a loom::pipeline
/// refuses to compile with one that is not.
template <class Schedule, std::size_t S, std::size_t M>
struct schedule_table {
  static_assert(detail::is_schedule<Schedule>::value,
                "loom::schedule_table<Schedule, S, M>: Schedule must be loom::gpipe, loom::one_f_one_b or "
                "loom::custom_schedule<...>");
  static_assert(S >= 1 && M >= 1, "loom::schedule_table<Schedule, S, M>: needs at least one stage and one micro-batch");
  using source = detail::schedule_source<Schedule>;
  static constexpr std::size_t stages = S;
  static constexpr std::size_t micro_batch_count = M;
  /// The number of stage tables the schedule gives (S for the built-in ones).
  static constexpr std::size_t given_stages = source::given_stages(S);

  /// Stage s's actions are actions[action_begin[s], action_begin[s + 1]).
  static constexpr std::array<std::size_t, S + 1> action_begin = [] {
    std::array<std::size_t, S + 1> b{};
    for (std::size_t s = 0; s < S; ++s) b[s + 1] = b[s] + source::length(s, S, M);
    return b;
  }();
  static constexpr std::array<pipeline_action, action_begin[S]> actions = [] {
    std::array<pipeline_action, action_begin[S]> a{};
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t i = action_begin[s]; i < action_begin[s + 1]; ++i) a[i] = source::at(s, i - action_begin[s], S, M);
    return a;
  }();
  /// Stage Stage's actions in execution order.
  template <std::size_t Stage>
  static constexpr auto actions_of = [] {
    static_assert(Stage < S, "loom::schedule_table::actions_of<Stage>: no such stage");
    std::array<pipeline_action, action_begin[Stage + 1] - action_begin[Stage]> a{};
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = actions[action_begin[Stage] + i];
    return a;
  }();

  /// Stage s's operations are ops[op_begin[s], op_begin[s + 1]).
  static constexpr std::array<std::size_t, S + 1> op_begin = [] {
    std::array<std::size_t, S + 1> b{};
    for (std::size_t s = 0; s < S; ++s) b[s + 1] = b[s] + detail::derive_ops<source>(s, S, M, [](std::size_t, pipeline_op) {});
    return b;
  }();
  static constexpr std::array<pipeline_op, op_begin[S]> ops = [] {
    std::array<pipeline_op, op_begin[S]> o{};
    for (std::size_t s = 0; s < S; ++s)
      detail::derive_ops<source>(s, S, M, [&](std::size_t i, pipeline_op op) { o[op_begin[s] + i] = op; });
    return o;
  }();
  /// Stage Stage's operations in execution order.
  template <std::size_t Stage>
  static constexpr auto ops_of = [] {
    static_assert(Stage < S, "loom::schedule_table::ops_of<Stage>: no such stage");
    std::array<pipeline_op, op_begin[Stage + 1] - op_begin[Stage]> a{};
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = ops[op_begin[Stage] + i];
    return a;
  }();

  /// The most micro-batches stage s has forwarded but not yet backwarded at any one time: how
  /// many micro-batches of activations it holds at its peak.
  static constexpr std::size_t peak_live_activations(std::size_t s) {
    std::size_t live = 0, peak = 0;
    for (std::size_t i = action_begin[s]; i < action_begin[s + 1]; ++i) {
      if (actions[i].pass == pipeline_pass::forward) ++live;
      else if (live > 0) --live;
      if (live > peak) peak = live;
    }
    return peak;
  }

  /// An idealised timeline in units where a forward takes forward_time and a backward
  /// backward_time (1 and 2: backward computes two products per forward one) and messages are
  /// free: start[i] is when actions[i] starts, each stage running its actions in order, a
  /// forward of m on s after that of m on s - 1, a backward of m on s after that of m on s + 1.
  static constexpr std::size_t forward_time = 1, backward_time = 2;
  static constexpr std::array<std::size_t, action_begin[S]> start = [] {
    std::array<std::size_t, action_begin[S]> t{};
    // finish[(s * 2 + pass) * M + m], 0 = not yet run
    std::array<std::size_t, S * 2 * M> finish{};
    std::array<std::size_t, S> next{}, idle_from{};
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t s = 0; s < S; ++s) {
        while (action_begin[s] + next[s] < action_begin[s + 1]) {
          const std::size_t i = action_begin[s] + next[s];
          const pipeline_action a = actions[i];
          if (a.micro_batch >= M) break;
          const bool fwd = a.pass == pipeline_pass::forward;
          std::size_t ready = idle_from[s];
          if (fwd && s > 0) {
            const std::size_t f = finish[((s - 1) * 2) * M + a.micro_batch];
            if (f == 0) break;
            ready = ready > f ? ready : f;
          }
          if (!fwd && s + 1 < S) {
            const std::size_t f = finish[((s + 1) * 2 + 1) * M + a.micro_batch];
            if (f == 0) break;
            ready = ready > f ? ready : f;
          }
          t[i] = ready;
          idle_from[s] = ready + (fwd ? forward_time : backward_time);
          finish[(s * 2 + (fwd ? 0 : 1)) * M + a.micro_batch] = idle_from[s];
          ++next[s];
          progress = true;
        }
      }
    }
    return t;
  }();
  /// When the last action of the step ends on the idealised timeline.
  static constexpr std::size_t makespan = [] {
    std::size_t end = 0;
    for (std::size_t i = 0; i < action_begin[S]; ++i) {
      const std::size_t e = start[i] + (actions[i].pass == pipeline_pass::forward ? forward_time : backward_time);
      end = e > end ? e : end;
    }
    return end;
  }();
  /// The share of the idealised timeline a stage spends idle: (S - 1) / (M + S - 1) for both
  /// built-in schedules.
  static constexpr double bubble_fraction =
      1.0 - static_cast<double>(M * (forward_time + backward_time)) / static_cast<double>(makespan);
};

/// What is wrong with a schedule, if anything (see verify_schedule).
enum class schedule_problem : unsigned char {
  none,
  wrong_stage_count,         // index = the number of stage tables given
  micro_batch_out_of_range,  // stage, index = action, micro_batch
  pass_repeated,             // stage, index = action, pass, micro_batch
  backward_before_forward,   // stage, index = action, micro_batch
  pass_missing,              // stage, pass, micro_batch
  send_receive_mismatch,     // stage, index = action, op, micro_batch, peer, peer_micro_batch
  deadlock,                  // stage, index = action, op, micro_batch
};

/// The verdict on a schedule table: the first problem found, and where.
struct schedule_verdict {
  schedule_problem problem = schedule_problem::none;
  std::size_t stage = 0, index = 0, micro_batch = 0;
  pipeline_pass pass = pipeline_pass::forward;
  pipeline_op_kind op = pipeline_op_kind::forward;
  std::size_t peer = 0, peer_micro_batch = 0;
};

/// Checks schedule table Table in two steps.
/// 1. Each stage runs the forward and the backward of each micro-batch in [0, M) exactly once,
///    the forward first.
/// 2. The stages' operations, run side by side with rendezvous semantics, all finish: a send
///    completes only when the neighbour has posted the receive on the same channel (no
///    buffering), a stage waits until every send and receive it posted together completed, and
///    a send finding its neighbour waiting on that channel for another micro-batch is an error
///    (the messages would be taken in the wrong order, or, tagged, wait for each other forever).
///    This is the strictest model: a schedule that finishes here also finishes with buffered or
///    non-blocking sends. When no stage can move and some have not finished, it deadlocks.
template <class Table>
constexpr schedule_verdict verify_schedule() {
  constexpr std::size_t S = Table::stages, M = Table::micro_batch_count;
  const auto& actions = Table::actions;
  const auto& ops = Table::ops;
  const auto& ab = Table::action_begin;
  const auto& ob = Table::op_begin;
  schedule_verdict v{};
  if (Table::given_stages != S) {
    v.problem = schedule_problem::wrong_stage_count;
    v.index = Table::given_stages;
    return v;
  }
  for (std::size_t s = 0; s < S; ++s) {
    std::array<bool, M> fwd{}, bwd{};
    for (std::size_t i = ab[s]; i < ab[s + 1]; ++i) {
      const pipeline_action a = actions[i];
      v.stage = s;
      v.index = i - ab[s];
      v.micro_batch = a.micro_batch;
      v.pass = a.pass;
      if (a.micro_batch >= M) {
        v.problem = schedule_problem::micro_batch_out_of_range;
        return v;
      }
      bool& seen = a.pass == pipeline_pass::forward ? fwd[a.micro_batch] : bwd[a.micro_batch];
      if (seen) {
        v.problem = schedule_problem::pass_repeated;
        return v;
      }
      if (a.pass == pipeline_pass::backward && !fwd[a.micro_batch]) {
        v.problem = schedule_problem::backward_before_forward;
        return v;
      }
      seen = true;
    }
    for (std::size_t m = 0; m < M; ++m) {
      if (!fwd[m] || !bwd[m]) {
        v.problem = schedule_problem::pass_missing;
        v.index = ab[s + 1] - ab[s];
        v.micro_batch = m;
        v.pass = !fwd[m] ? pipeline_pass::forward : pipeline_pass::backward;
        return v;
      }
    }
  }
  v = schedule_verdict{};

  // Rendezvous simulation. pc[s]: stage s's next operation (absolute index into ops); its posted
  // group is [pc[s], group_end(s)).
  std::array<std::size_t, S> pc{};
  for (std::size_t s = 0; s < S; ++s) pc[s] = ob[s];
  std::array<bool, Table::op_begin[S]> done{};
  auto group_end = [&](std::size_t s) {
    std::size_t j = pc[s];
    while (j + 1 < ob[s + 1] && ops[j].posted_with_next) ++j;
    return j + 1;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < S; ++s) {
      if (pc[s] == ob[s + 1]) continue;
      if (!is_communication(ops[pc[s]].kind)) {
        ++pc[s];
        progress = true;
        continue;
      }
      const std::size_t end = group_end(s);
      for (std::size_t j = pc[s]; j < end; ++j) {
        if (done[j] || !is_send(ops[j].kind)) continue;
        const std::size_t p = peer_of(ops[j].kind, s);
        if (pc[p] == ob[p + 1] || !is_communication(ops[pc[p]].kind)) continue;
        const std::size_t peer_end = group_end(p);
        for (std::size_t q = pc[p]; q < peer_end; ++q) {
          if (done[q] || ops[q].kind != counterpart_of(ops[j].kind)) continue;
          if (ops[q].micro_batch != ops[j].micro_batch) {
            v.problem = schedule_problem::send_receive_mismatch;
            v.stage = s;
            v.index = ops[j].action;
            v.op = ops[j].kind;
            v.micro_batch = ops[j].micro_batch;
            v.peer = p;
            v.peer_micro_batch = ops[q].micro_batch;
            return v;
          }
          done[j] = done[q] = true;
          progress = true;
          break;
        }
      }
      bool all = true;
      for (std::size_t j = pc[s]; j < end; ++j) all = all && done[j];
      if (all) {
        pc[s] = end;
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < S; ++s) {
    if (pc[s] == ob[s + 1]) continue;
    std::size_t j = pc[s];
    while (done[j]) ++j;  // the first operation of the posted group that never completes
    v.problem = schedule_problem::deadlock;
    v.stage = s;
    v.index = ops[j].action;
    v.op = ops[j].kind;
    v.micro_batch = ops[j].micro_batch;
    return v;
  }
  return v;
}

/// Whether schedule table Table is sound: every stage runs each micro-batch's passes once, and
/// every send is matched by its neighbour's receive of the same kind and micro-batch, in the
/// same order, without deadlock (see verify_schedule for the model).
template <class Table>
constexpr bool pairs_up() {
  return verify_schedule<Table>().problem == schedule_problem::none;
}

namespace detail {
/// verify_schedule<Table>() as a compile error: a sentence, then a marker with the numbers.
template <class Table>
constexpr bool check_schedule() {
  constexpr schedule_verdict v = verify_schedule<Table>();
  using enum schedule_problem;
  if constexpr (v.problem == wrong_stage_count) {
    static_assert(v.problem != wrong_stage_count,
                  "loom::custom_schedule: the schedule has a different number of stage tables than the pipeline has "
                  "stages (both numbers are in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::custom_schedule_has_wrong_number_of_stages<v.index, Table::stages>>();
  } else if constexpr (v.problem == micro_batch_out_of_range) {
    static_assert(v.problem != micro_batch_out_of_range,
                  "loom::pipeline: a schedule table names a micro-batch outside [0, M) (the stage, the action's index "
                  "and the micro-batch are in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::schedule_micro_batch_out_of_range_at_stage<v.stage, v.index, v.micro_batch, Table::micro_batch_count>>();
  } else if constexpr (v.problem == pass_repeated) {
    static_assert(v.problem != pass_repeated,
                  "loom::pipeline: a schedule table runs the same pass of a micro-batch twice on one stage: each stage "
                  "runs every micro-batch's forward and backward exactly once (where: in the loom::diagnostic:: name)");
    return fail_with<diagnostic::schedule_repeats_pass_at_stage<v.stage, v.index, v.pass, v.micro_batch>>();
  } else if constexpr (v.problem == backward_before_forward) {
    static_assert(v.problem != backward_before_forward,
                  "loom::pipeline: a schedule table runs a micro-batch's backward before its forward on one stage "
                  "(where: in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::schedule_runs_backward_before_forward_at_stage<v.stage, v.index, v.micro_batch>>();
  } else if constexpr (v.problem == pass_missing) {
    static_assert(v.problem != pass_missing,
                  "loom::pipeline: a schedule table never runs one pass of a micro-batch on a stage: each stage runs "
                  "every micro-batch's forward and backward exactly once (where: in the loom::diagnostic:: name)");
    return fail_with<diagnostic::schedule_misses_pass_at_stage<v.stage, v.pass, v.micro_batch>>();
  } else if constexpr (v.problem == send_receive_mismatch) {
    static_assert(v.problem != send_receive_mismatch,
                  "loom::pipeline: the schedule's sends and receives do not pair up: a stage sends one micro-batch "
                  "where its neighbour waits for another (the stage, its action's index, the operation and both "
                  "micro-batches are in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::schedule_send_does_not_match_receive_at_stage<v.stage, v.index, v.op, v.micro_batch,
                                                                               v.peer, v.peer_micro_batch>>();
  } else if constexpr (v.problem == deadlock) {
    static_assert(v.problem != deadlock,
                  "loom::pipeline: the schedule's sends and receives do not pair up: the stages would wait for each "
                  "other forever (the first waiting stage, its action's index, the operation and the micro-batch are "
                  "in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::schedule_deadlocks_at_stage<v.stage, v.index, v.op, v.micro_batch>>();
  } else {
    return true;
  }
}

template <std::size_t Stages, class... Options>
constexpr bool check_pipeline() {
  using cuts = first_of<is_cut_at, balanced_cuts, Options...>;
  // The position of the first option that is not one of pipeline's (or the number of options).
  constexpr std::size_t unknown = [] {
    std::size_t k = 0;
    bool found = false;
    ((found = found || !is_pipeline_option<Options>::value, k += found ? 0 : 1), ...);
    return k;
  }();
  if constexpr (Stages == 0) {
    static_assert(Stages != 0, "loom::pipeline<Stages, ...>: a pipeline needs at least one stage");
    return false;
  } else if constexpr (unknown < sizeof...(Options)) {
    using option = at<unknown, type_list<Options...>>;
    static_assert(is_pipeline_option<option>::value,
                  "loom::pipeline<Stages, Options...>: an option is not one of pipeline's (loom::micro_batches<M>, "
                  "loom::gpipe, loom::one_f_one_b, loom::custom_schedule<...>, loom::cut_at<...>); its name is in the "
                  "loom::diagnostic:: name the compiler prints");
    return fail_with<diagnostic::not_a_pipeline_option<option>>();
  } else if constexpr (count_of<is_micro_batches, Options...> > 1) {
    static_assert(count_of<is_micro_batches, Options...> <= 1,
                  "loom::pipeline: micro_batches<...> is given more than once; keep one");
    return false;
  } else if constexpr (count_of<is_schedule, Options...> > 1) {
    static_assert(count_of<is_schedule, Options...> <= 1,
                  "loom::pipeline: more than one schedule is given (loom::gpipe, loom::one_f_one_b, "
                  "loom::custom_schedule<...>); keep one");
    return false;
  } else if constexpr (count_of<is_cut_at, Options...> > 1) {
    static_assert(count_of<is_cut_at, Options...> <= 1, "loom::pipeline: cut_at<...> is given more than once; keep one");
    return false;
  } else if constexpr (is_cut_at<cuts>::value && cuts::count != Stages - 1) {
    static_assert(cuts::count == Stages - 1,
                  "loom::pipeline<Stages, loom::cut_at<...>>: cut_at needs exactly Stages - 1 cut points, the index of "
                  "the first layer of each stage after the first (both numbers are in the loom::diagnostic:: name)");
    return fail_with<diagnostic::wrong_number_of_cut_points<cuts::count, Stages - 1>>();
  } else {
    constexpr std::size_t bad = [] {
      // A range-for: with no cut points, `i < cuts::count` would compare with 0 (nvcc's #186-D).
      std::size_t i = 0;
      for (std::size_t p : cuts::points) {
        if (i > 0 && p <= cuts::points[i - 1]) return i;
        ++i;
      }
      return cuts::count;
    }();
    if constexpr (bad < cuts::count) {
      static_assert(bad >= cuts::count,
                    "loom::cut_at<...>: the cut points must be strictly increasing layer indices (the cut point's "
                    "position and the two layers are in the loom::diagnostic:: name the compiler prints)");
      return fail_with<diagnostic::cut_points_not_increasing<bad, cuts::points[bad - 1], cuts::points[bad]>>();
    } else {
      return true;
    }
  }
}

/// The options first; the schedule only when they are sound, so one mistake is one report.
template <class Schedule, std::size_t Stages, class... Options>
constexpr bool check_pipeline_and_schedule() {
  if constexpr (check_pipeline<Stages, Options...>())
    return check_schedule<Schedule>();
  else
    return false;
}
}  // namespace detail

/// Pipeline model parallelism over Stages stages (one rank each). Options, in any order:
/// micro_batches<M> (default 1), a schedule (loom::one_f_one_b (default), loom::gpipe or a
/// loom::custom_schedule<...>), and cut_at<...> (default: balanced by cost). A schedule whose
/// sends and receives do not pair up does not compile (see verify_schedule).
template <std::size_t Stages, class... Options>
struct pipeline {
  static constexpr std::size_t stages = Stages;
  static constexpr std::size_t micro_batch_count =
      detail::first_of<detail::is_micro_batches, micro_batches<1>, Options...>::value;
  /// loom::gpipe, loom::one_f_one_b or the loom::custom_schedule<...>.
  using schedule_policy = detail::first_of<detail::is_schedule, one_f_one_b, Options...>;
  /// Whether the stages are balanced by cost (no cut_at given).
  static constexpr bool balanced = detail::count_of<detail::is_cut_at, Options...> == 0;
  /// The user's cut points (empty when balanced).
  static constexpr auto cut_points = detail::first_of<detail::is_cut_at, detail::balanced_cuts, Options...>::points;
  /// The schedule's tables (valid when ok).
  using schedule = schedule_table<std::conditional_t<detail::is_schedule<schedule_policy>::value, schedule_policy, one_f_one_b>,
                                  (Stages > 0 ? Stages : 1), (micro_batch_count > 0 ? micro_batch_count : 1)>;
  /// Whether the options and the schedule are sound (if not, a static_assert has said why).
  static constexpr bool ok = detail::check_pipeline_and_schedule<schedule, Stages, Options...>();

 private:
  using checked_ = std::bool_constant<ok>;  // reports a problem as soon as the pipeline type is used
};

template <class T>
inline constexpr bool is_pipeline_v = false;
template <std::size_t S, class... O>
inline constexpr bool is_pipeline_v<pipeline<S, O...>> = true;

// ---- The partition ----------------------------------------------------------------------------

namespace detail {
template <class Shape>
struct input_for_shape;
template <std::size_t... D>
struct input_for_shape<shape<D...>> {
  using type = input<D...>;
};

template <class Network, std::size_t First, class Indices>
struct sub_network;
template <class Input, class... Layers, std::size_t First, std::size_t... K>
struct sub_network<network<Input, Layers...>, First, std::index_sequence<K...>> {
  using chain = typename network<Input, Layers...>::chain;
  using type = network<typename input_for_shape<typename chain::template input_of<First>>::type,
                       at<First + K, type_list<Layers...>>...>;
};

/// Elements per sample of each layer's input, then of the network's output.
template <class Network, std::size_t... I>
constexpr auto boundary_sizes(std::index_sequence<I...>) {
  using chain = typename Network::chain;
  if constexpr (chain::ok)
    return std::array<std::size_t, sizeof...(I) + 1>{chain::template input_of<I>::size..., chain::output_shape::size};
  else
    return std::array<std::size_t, sizeof...(I) + 1>{};
}

/// Cut points that minimise the largest stage cost; among those, the smallest sum of squared
/// stage costs; then the earliest cuts. Exact: a dynamic programme over (stages, prefix).
/// Requires L >= S >= 1.
template <std::size_t L, std::size_t S>
constexpr std::array<std::size_t, S + 1> balance(const std::array<double, L>& cost) {
  std::array<double, L + 1> prefix{};
  for (std::size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + cost[i];
  constexpr double none = -1;
  // Pass 1: worst[k][j] = the least possible largest stage cost of layers [0, j) in k stages.
  std::array<std::array<double, L + 1>, S + 1> worst{};
  for (auto& row : worst) row.fill(none);
  for (std::size_t j = 1; j <= L; ++j) worst[1][j] = prefix[j];
  for (std::size_t k = 2; k <= S; ++k)
    for (std::size_t j = k; j <= L; ++j)
      for (std::size_t i = k - 1; i < j; ++i) {
        const double c = prefix[j] - prefix[i];
        const double w = worst[k - 1][i] > c ? worst[k - 1][i] : c;
        if (worst[k][j] == none || w < worst[k][j]) worst[k][j] = w;
      }
  const double limit = worst[S][L];
  // Pass 2: squares[k][j] = the least sum of squared stage costs with no stage above limit.
  std::array<std::array<double, L + 1>, S + 1> squares{};
  std::array<std::array<std::size_t, L + 1>, S + 1> from{};
  for (auto& row : squares) row.fill(none);
  for (std::size_t j = 1; j <= L; ++j)
    if (prefix[j] <= limit) squares[1][j] = prefix[j] * prefix[j];
  for (std::size_t k = 2; k <= S; ++k)
    for (std::size_t j = k; j <= L; ++j)
      for (std::size_t i = k - 1; i < j; ++i) {
        const double c = prefix[j] - prefix[i];
        if (squares[k - 1][i] == none || c > limit) continue;
        const double q = squares[k - 1][i] + c * c;
        if (squares[k][j] == none || q < squares[k][j]) squares[k][j] = q, from[k][j] = i;
      }
  std::array<std::size_t, S + 1> bounds{};
  bounds[S] = L;
  for (std::size_t k = S; k > 1; --k) bounds[k - 1] = from[k][bounds[k]];
  return bounds;
}

template <class Network, class Pipeline>
constexpr bool check_partition() {
  constexpr std::size_t S = Pipeline::stages, L = Network::layer_count;
  if constexpr (!Pipeline::ok || !Network::chain::ok) {
    return false;  // already reported
  } else if constexpr (S > L) {
    static_assert(S <= L,
                  "loom::pipeline: more stages than the network has layers: every stage needs at least one layer (both "
                  "numbers are in the loom::diagnostic:: name the compiler prints)");
    return fail_with<diagnostic::more_stages_than_layers<S, L>>();
  } else {
    constexpr auto& cuts = Pipeline::cut_points;
    constexpr std::size_t bad = [] {
      // A range-for: with no cut points, `i < cuts.size()` would compare with 0 (nvcc's #186-D).
      std::size_t i = 0;
      for (std::size_t c : cuts) {
        if (c < 1 || c >= L) return i;
        ++i;
      }
      return cuts.size();
    }();
    if constexpr (bad < cuts.size()) {
      static_assert(bad >= cuts.size(),
                    "loom::cut_at<...>: a cut point is out of range: each is the index of the first layer of a stage "
                    "after the first, in [1, layer_count - 1] (the cut point's position, its value and the layer count "
                    "are in the loom::diagnostic:: name the compiler prints)");
      return fail_with<diagnostic::cut_point_out_of_range<bad, cuts[bad], L>>();
    } else {
      return true;
    }
  }
}
}  // namespace detail

/// The layers of Network cut into Pipeline::stages stages: stage s owns layers
/// [bounds[s], bounds[s + 1]) and only their parameters, in its own flat buffer.
///
/// Cost model, for balancing: a layer costs its forward FLOPs per sample as each layer states
/// them (`flops<In>`: 2 * in * out for linear, 2 * k^2 * c_in per output element for conv2d, one
/// per element for activations and pooling windows), but at least the number of elements of its
/// input, which every layer reads (so flatten, a copy, is not free). The backward pass costs
/// about twice the forward in every layer, so counting it would scale all costs alike and choose
/// the same cuts. Without cut_at, the cuts minimise the cost of the most expensive stage (the
/// one that sets the pace of the pipeline); among equally good cuts, the one with the smallest
/// sum of squared stage costs (the other stages as even as possible), then the earliest.
/// Communication is not counted.
template <class Network, class Pipeline>
struct stage_partition {
  static_assert(is_network_v<Network>, "loom::stage_partition<Network, Pipeline>: Network must be a loom::network<...>");
  static_assert(is_pipeline_v<Pipeline>, "loom::stage_partition<Network, Pipeline>: Pipeline must be a loom::pipeline<...>");
  static constexpr std::size_t stages = Pipeline::stages;
  static constexpr std::size_t layer_count = Network::layer_count;
  /// Whether the partition is sound (if not, a static_assert has said why).
  static constexpr bool ok = detail::check_partition<Network, Pipeline>();

  /// Elements per sample entering layer i (i < layer_count) and leaving the network (i =
  /// layer_count).
  static constexpr std::array<std::size_t, layer_count + 1> boundary_sizes =
      detail::boundary_sizes<Network>(std::make_index_sequence<layer_count>{});
  /// Each layer's cost (see the cost model above).
  static constexpr std::array<double, layer_count> layer_costs = [] {
    std::array<double, layer_count> c{};
    for (std::size_t i = 0; i < layer_count; ++i) {
      const double elements = static_cast<double>(boundary_sizes[i]);
      c[i] = Network::layer_flops[i] > elements ? Network::layer_flops[i] : elements;
    }
    return c;
  }();

  /// Stage s owns layers [bounds[s], bounds[s + 1]).
  static constexpr std::array<std::size_t, stages + 1> bounds = [] {
    std::array<std::size_t, stages + 1> b{};
    if constexpr (ok) {
      if constexpr (Pipeline::balanced) {
        b = detail::balance<layer_count, stages>(layer_costs);
      } else {
        for (std::size_t s = 1; s < stages; ++s) b[s] = Pipeline::cut_points[s - 1];
        b[stages] = layer_count;
      }
    }
    return b;
  }();
  /// The stage that owns layer i.
  static constexpr std::size_t stage_of_layer(std::size_t i) {
    std::size_t s = 0;
    while (s + 1 < stages && bounds[s + 1] <= i) ++s;
    return s;
  }
  /// Layers per stage.
  static constexpr std::array<std::size_t, stages> layer_counts = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s) n[s] = bounds[s + 1] - bounds[s];
    return n;
  }();
  /// Parameters per stage: the size of stage s's own flat parameter (and gradient) buffer.
  static constexpr std::array<std::size_t, stages> parameter_counts = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) n[s] += Network::parameter_counts[i];
    return n;
  }();
  /// Where stage s's parameters start in the whole network's flat buffer (for checkpoints that
  /// gather the stages into one model).
  static constexpr std::array<std::size_t, stages> parameter_offsets = [] {
    std::array<std::size_t, stages> o{};
    for (std::size_t s = 0; s < stages; ++s) o[s] = bounds[s] < layer_count ? Network::parameter_offsets[bounds[s]] : 0;
    return o;
  }();
  /// Buffers (running statistics) per stage, and where stage s's start in the whole network's
  /// flat buffer of buffers: a stage holds its own layers'.
  static constexpr std::array<std::size_t, stages> buffer_counts = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) n[s] += Network::buffer_counts[i];
    return n;
  }();
  static constexpr std::array<std::size_t, stages> buffer_offsets = [] {
    std::array<std::size_t, stages> o{};
    for (std::size_t s = 0; s < stages; ++s) o[s] = bounds[s] < layer_count ? Network::buffer_offsets[bounds[s]] : 0;
    return o;
  }();
  /// Forward FLOPs per sample of each stage (the sum of its layers' Network::layer_flops).
  static constexpr std::array<double, stages> flops = [] {
    std::array<double, stages> f{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) f[s] += Network::layer_flops[i];
    return f;
  }();
  /// Each stage's cost (the sum of its layer_costs), and the largest: the pipeline's pace.
  static constexpr std::array<double, stages> costs = [] {
    std::array<double, stages> c{};
    for (std::size_t s = 0; s < stages; ++s)
      for (std::size_t i = bounds[s]; i < bounds[s + 1]; ++i) c[s] += layer_costs[i];
    return c;
  }();
  static constexpr double bottleneck_cost = [] {
    double m = 0;
    for (double c : costs) m = c > m ? c : m;
    return m;
  }();
  /// Elements per sample stage s sends to stage s + 1 (and receives back as their gradient);
  /// for the last stage, the network's output.
  static constexpr std::array<std::size_t, stages> output_sizes = [] {
    std::array<std::size_t, stages> n{};
    for (std::size_t s = 0; s < stages; ++s) n[s] = boundary_sizes[bounds[s + 1]];
    return n;
  }();

  /// Stage Stage as an ordinary loom::network: input = the previous stage's output shape, then
  /// its layers. Its parameter_count is parameter_counts[Stage] and its parameter_offsets are
  /// the network's, less parameter_offsets[Stage]. Layer i of the stage is layer bounds[Stage]
  /// + i of the network (the index that seeds its random stream).
  template <std::size_t Stage>
  using stage_network = typename std::conditional_t<
      ok, detail::sub_network<Network, bounds[Stage < stages ? Stage : 0],
                              std::make_index_sequence<bounds[(Stage < stages ? Stage : 0) + 1] - bounds[Stage < stages ? Stage : 0]>>,
      std::type_identity<network<input<1>, detail::already_reported>>>::type;

 private:
  using checked_ = std::bool_constant<ok>;
};

// ---- The policy -------------------------------------------------------------------------------

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
