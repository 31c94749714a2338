// SPDX-License-Identifier: Apache-2.0
#pragma once
// The schedules of pipeline model parallelism as compile-time tables: the schedule options
// (loom::gpipe, loom::one_f_one_b, a loom::custom_schedule<...> of stage_actions), the operations
// a stage's run derives from its actions (passes, sends and receives), and loom::schedule_table,
// which computes each stage's actions and operations, its peak of live activations and the
// schedule's makespan. Whether a table is sound is verify.hpp's question; the policy that names a
// schedule is loom::pipeline (policy.hpp).

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace loom {

/// Schedule GPipe: every stage runs the forwards of all M micro-batches, then their backwards in
/// reverse order (B(M-1) first, so the last stage starts backward on the micro-batch it has just
/// forwarded). A stage keeps the activations of all M micro-batches alive at once.
struct gpipe {};

/// Schedule 1F1B (PipeDream-Flush): stage s runs min(S - s - 1, M) warm-up forwards, then
/// alternates one forward and one backward, then the remaining backwards. Same bubble as GPipe,
/// but stage s keeps at most min(S - s, M) micro-batches of activations alive instead of M.
struct one_f_one_b {};

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
}  // namespace detail

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
}  // namespace loom
