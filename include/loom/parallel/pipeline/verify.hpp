// SPDX-License-Identifier: Apache-2.0
#pragma once
// The verification of a pipeline schedule: loom::verify_schedule<Table>(), a constexpr model that
// runs the stages' operations side by side with rendezvous semantics and returns the first
// problem (a pass missing or repeated, a backward before its forward, a send without its
// receive, a deadlock), loom::pairs_up<Table>(), and detail::check_schedule, which turns a
// verdict into a compile error with a sentence and a loom::diagnostic:: marker
// (diagnostics.hpp). The tables it checks are schedule.hpp's.

#include <array>
#include <cstddef>

#include "loom/layers/layer.hpp"
#include "loom/parallel/pipeline/diagnostics.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom {

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
}  // namespace detail

}  // namespace loom
