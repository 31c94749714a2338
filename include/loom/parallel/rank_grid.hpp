// SPDX-License-Identifier: Apache-2.0
#pragma once
// The 2-D grid of ranks of a split model (loom/parallel/hybrid.hpp), written once for the
// pipeline stages and the tensor-parallel slices: world rank r holds place r % P (its stage or
// its slice) of model replica r / P. The one rule on the world's size, with its sentence (which
// loom::world_size_rules and loom::valid_world_sizes apply too); the splits of the world into
// model-parallel groups (colour r / P: pipeline messages, tensor-parallel allreduces) and
// data-parallel groups (colour r % P: the gradient allreduce over the replicas of a place);
// failure detection over the world and its groups, and their split anew after a recovery.
// Consecutive ranks form one model-parallel group, so that the traffic-heavy group stays on one
// machine when ranks are placed by slot (mpirun's default).

#include <cstddef>
#include <string>
#include <utility>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom::detail {

/// A communicator whose failure detector the groups split from it can share
/// (watch_as_part_of: loom::mpi_comm), so that one roll call over the world names a dead rank.
template <class Comm>
concept part_watching_communicator = requires(Comm& c) { c.watch_as_part_of(c); };
/// One that is also rebuilt over the survivors of a recovery (replace_after_recovery), so that
/// a grid's groups can be split from it again.
template <class Comm>
concept regrouping_communicator = part_watching_communicator<Comm> && requires(Comm& c) {
  c.replace_after_recovery(std::move(c));
};

/// The world sizes a grid of `group` ranks per model replica takes: exactly `group` (one
/// replica: model_parallel), or any multiple of it (`replicated`: loom::hybrid). `member` names
/// a group's ranks in messages ("stage", "slice").
struct grid_shape {
  std::size_t group = 1;
  bool replicated = false;
  const char* member = "rank";

  /// The rule: whether `world` ranks make whole model replicas of this grid.
  constexpr bool accepts(std::size_t world) const noexcept {
    return world > 0 && world % group == 0 && (replicated || world == group);
  }
  /// Why `world` ranks do not (empty when they do), in the words the engines throw with.
  std::string refusal(std::size_t world) const {
    if (accepts(world)) return {};
    const std::string g = std::to_string(group), members = g + " " + member + "s";
    if (replicated)
      return "the world has " + std::to_string(world) + " ranks, expected a multiple of the " + members + " (" + g +
             " ranks per model replica, times the replicas)";
    return "the world has " + std::to_string(world) + " ranks, expected exactly " + g + ", one for each of the " + members +
           ": start " + g + " processes (mpirun -np " + g +
           ") or use loom::hybrid<loom::data_parallel<...>, ...> for more";
  }
};

/// The grid over a world communicator (see the file comment). The groups themselves belong to
/// their users (a pipeline stage's messages, a tensor group, a gradient_allreduce): the grid
/// makes them, watches them and makes them again after a recovery.
template <class Comm>
class rank_grid {
 public:
  /// Takes `world`; throws loom::invalid_argument, `who` + ": " + the shape's refusal, when its
  /// size does not fit the shape (on every rank alike, before any communication).
  rank_grid(Comm world, grid_shape shape, const std::string& who) : world_(std::move(world)), shape_(shape) {
    if (!shape_.accepts(static_cast<std::size_t>(world_.size())))
      throw invalid_argument(who + ": " + shape_.refusal(static_cast<std::size_t>(world_.size())));
    place_ = world_.rank() % group();
  }

  int group() const noexcept { return static_cast<int>(shape_.group); }
  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  /// This rank's place in its replica (its stage or slice), fixed for the run.
  int place() const noexcept { return place_; }
  int replica() const { return world_.rank() / group(); }
  int replicas() const { return world_.size() / group(); }
  Comm& world() noexcept { return world_; }
  const Comm& world() const noexcept { return world_; }

  /// This rank's model-parallel group (ranked by place) and data-parallel group (ranked by
  /// replica), split from the world. Collective over the world.
  Comm split_group() { return world_.split(replica(), world_.rank()); }
  Comm split_data() { return world_.split(place_, world_.rank()); }

  /// Failure detection over the whole job: the world's detector with deadline_s, shared by the
  /// groups (watched as parts of it), so that a dead or stopped rank anywhere makes every rank's
  /// wait end and one roll call over the world names it. `data`: null without data parallelism.
  /// Collective over the world.
  void watch_for_failures(double deadline_s, Comm& group, Comm* data) {
    world_.watch_for_failures(deadline_s);
    group.watch_as_part_of(world_);
    if (data) data->watch_as_part_of(world_);
  }
  void set_deadline(double deadline_s) { world_.set_deadline(deadline_s); }

  /// After a recovery replaced the world with whole replicas (a rank keeps its place, r % P):
  /// splits it into the groups again, watched as parts of it. Collective over the new world.
  void after_recovery(Comm& group, Comm* data) {
    const int r = world_.rank();
    if (r % this->group() != place_)
      throw communication_error("loom: internal error: after a recovery rank " + std::to_string(r) + " would hold " +
                                shape_.member + " " + std::to_string(r % this->group()) + ", not its own " +
                                std::to_string(place_));
    group.replace_after_recovery(split_group());
    group.watch_as_part_of(world_);
    if (data) {
      data->replace_after_recovery(split_data());
      data->watch_as_part_of(world_);
    }
  }

  /// Whether each optimizer step is to be committed over the world before it is taken
  /// (detail::step_commit, where the fit recovers): under failure detection, with several
  /// replicas. (A communicator that recovers, loom::mpi_comm.)
  bool commits() const { return world_.watch() != nullptr && replicas() > 1; }

 private:
  Comm world_;
  grid_shape shape_;
  int place_ = 0;
};

}  // namespace loom::detail
