// SPDX-License-Identifier: Apache-2.0
#pragma once
// Marker templates of the parallelism plans (pipeline partitions and schedules): never defined,
// named by a failing check so that the compiler prints the numbers involved. The checks and
// their sentences live in policy.hpp, partition.hpp and verify.hpp beside it; the layers' markers in layer.hpp.

#include <cstddef>

/// Search the compiler output for "loom::diagnostic::" to find the values a check names.
namespace loom::diagnostic {

/// loom::cut_at<...>: cut point number CutIndex (counted from 0) is layer Cut, but a cut point
/// must be a layer index in [1, LayerCount - 1].
template <std::size_t CutIndex, std::size_t Cut, std::size_t LayerCount>
struct cut_point_out_of_range;
/// loom::cut_at<...>: cut point number CutIndex (layer Cut) does not come after the one before
/// it (layer Previous).
template <std::size_t CutIndex, std::size_t Previous, std::size_t Cut>
struct cut_points_not_increasing;
/// loom::pipeline<Stages, cut_at<...>>: Given cut points where Stages - 1 = Expected are needed.
template <std::size_t Given, std::size_t Expected>
struct wrong_number_of_cut_points;
/// A pipeline of Stages stages over a network of LayerCount layers: every stage needs a layer.
template <std::size_t Stages, std::size_t LayerCount>
struct more_stages_than_layers;
/// loom::pipeline<Stages, Options...>: Option is none of pipeline's options.
template <class Option>
struct not_a_pipeline_option;
/// loom::custom_schedule<...> with Given stage tables for a pipeline of Stages stages.
template <std::size_t Given, std::size_t Stages>
struct custom_schedule_has_wrong_number_of_stages;
/// Action ActionIndex of stage Stage's table names micro-batch MicroBatch; a step has
/// MicroBatches of them.
template <std::size_t Stage, std::size_t ActionIndex, std::size_t MicroBatch, std::size_t MicroBatches>
struct schedule_micro_batch_out_of_range_at_stage;
/// Action ActionIndex of stage Stage runs Pass of MicroBatch a second time.
template <std::size_t Stage, std::size_t ActionIndex, auto Pass, std::size_t MicroBatch>
struct schedule_repeats_pass_at_stage;
/// Action ActionIndex of stage Stage runs the backward of MicroBatch before its forward.
template <std::size_t Stage, std::size_t ActionIndex, std::size_t MicroBatch>
struct schedule_runs_backward_before_forward_at_stage;
/// Stage Stage's table never runs Pass of MicroBatch.
template <std::size_t Stage, auto Pass, std::size_t MicroBatch>
struct schedule_misses_pass_at_stage;
/// Stage Stage posts Op (a send or receive of MicroBatch, part of its action ActionIndex) and
/// no neighbour ever posts the matching operation: the stages wait for each other forever.
template <std::size_t Stage, std::size_t ActionIndex, auto Op, std::size_t MicroBatch>
struct schedule_deadlocks_at_stage;
/// Stage Stage sends (Op) micro-batch MicroBatch, part of its action ActionIndex, while its
/// neighbour Peer waits on that channel for micro-batch PeerMicroBatch.
template <std::size_t Stage, std::size_t ActionIndex, auto Op, std::size_t MicroBatch, std::size_t Peer,
          std::size_t PeerMicroBatch>
struct schedule_send_does_not_match_receive_at_stage;

}  // namespace loom::diagnostic
