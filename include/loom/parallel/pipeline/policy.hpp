// SPDX-License-Identifier: Apache-2.0
#pragma once
// The policy of pipeline model parallelism: loom::pipeline<Stages, Options...> and its options
// other than the schedule (loom::micro_batches<M>, loom::cut_at<...>; the schedules are in
// schedule.hpp), with the checks of the options, which report one mistake at a time. The
// partition of a network's layers into the stages is partition.hpp's, the run-time half
// engine.hpp's; loom::model_parallel<loom::pipeline<...>, Comm> is loom/parallel/model_parallel.hpp.

#include <array>
#include <cstddef>
#include <type_traits>

#include "loom/core/type_list.hpp"
#include "loom/layers/layer.hpp"
#include "loom/parallel/pipeline/diagnostics.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/verify.hpp"

namespace loom {

/// Option of pipeline: each step's batch is split into M micro-batches that flow through the
/// stages one after the other (default 1: no overlap between stages at all).
template <std::size_t M>
struct micro_batches {
  static_assert(M >= 1, "loom::micro_batches<M>: a step needs at least one micro-batch");
  static constexpr std::size_t value = M;
};

/// Option of pipeline: user-given cut points, the index of the first layer of stages 1 .. S-1
/// (counted from 0 after loom::input). Requires S - 1 strictly increasing points, each in
/// [1, layer_count - 1]. Without it, stages are balanced by cost (see stage_partition).
template <std::size_t... Cuts>
struct cut_at {
  static constexpr std::size_t count = sizeof...(Cuts);
  static constexpr std::array<std::size_t, sizeof...(Cuts)> points{Cuts...};
};

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
}  // namespace loom
