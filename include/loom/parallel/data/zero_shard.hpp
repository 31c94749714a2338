// SPDX-License-Identifier: Apache-2.0
#pragma once
// ZeRO stage 1 on one rank (loom::shard_optimizer_state), written once for every engine that
// shards its optimizer state (replica_engine under data_parallel and the tensor-parallel hybrid,
// pipeline_engine under the pipeline hybrid): this rank's slices of the summed gradients, which
// the data-parallel group's reduce-scatters fill (loom::zero_layout says where), their blocks of
// the whole network's layout (the optimizer state's shard map), and the step of those slices
// followed by the parameters' allgathers, which the next forward completes. The communication
// itself is detail::bucket_allreduce's (loom/parallel/data/data_parallel.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "loom/backend/kernels/optim.hpp"
#include "loom/core/memory.hpp"
#include "loom/optim/clip.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom::detail {

/// Whether an optimizer state steps part of itself (step_part, end_step: loom's optimizers do).
template <class State, class T>
concept steps_in_place = requires(State& s, T* p, const T* g, std::size_t n, float lr) {
  s.step_part(p, g, n, n, lr);
  s.end_step();
};

/// ZeRO's step of a rank's slices: the blocks z.pieces of params (the rank's own flat layout)
/// stepped with their reduced gradients g (the shard, z.shard_count values) and `state` (the
/// shard's) at learning rate lr — where they lie when the state steps in place, else on a
/// contiguous copy in `copy` (sized here). Backend's memory; z a loom::zero_layout.
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

/// One rank's ZeRO state besides the optimizer's own (see the file comment). `Reduction` below is
/// the data-parallel group's gradient_allreduce (or a sync that forwards its ZeRO calls).
template <class T, class Backend>
class zero_shard {
  using space = typename Backend::memory_space;

 public:
  /// Gives `r` this rank's slices of the reduced gradients, sized for the world as it is.
  template <class Reduction>
  void bind(Reduction& r) {
    count_ = r.zero().shard_count;
    gradients_ = buffer<T, space>(std::max<std::size_t>(1, count_));
    r.bind_shard(gradients_.data());
  }
  /// The slices' blocks of the whole network's layout (the optimizer state's shard map).
  void set_pieces(std::span<const shard_piece> pieces) { pieces_.assign(pieces.begin(), pieces.end()); }
  /// The same, given in a part's own layout that starts at `offset` of the whole (a stage's).
  void set_pieces(std::span<const shard_piece> pieces, std::size_t offset) {
    set_pieces(pieces);
    for (shard_piece& q : pieces_) q.whole_offset += offset;
  }

  /// Values in this rank's shard (of every optimizer buffer, too).
  std::size_t count() const noexcept { return count_; }
  /// The reduced gradients of the shard (count() values, Backend's memory), complete after a
  /// step's last micro-step.
  T* gradients() noexcept { return gradients_.data(); }
  /// What this rank holds of the optimizer state: `m` (what it holds of the parameters) with
  /// the shard's blocks, every rank as replica 0 of 1 — together the ranks hold the one copy.
  shard_map state_map(shard_map m) const {
    m.replica = 0;
    m.replicas = 1;
    m.local_count = count_;
    m.pieces = pieces_;
    return m;
  }
  /// The squared L2 norm of the shard's gradients (this rank's part of the whole model's).
  double squares() const { return count_ ? Backend::sum(count_, squared_term<T>{gradients_.data()}) : 0.0; }
  /// Scales the shard's gradients so that a whole-model norm `norm` becomes at most `clip`.
  void clip_to(double norm, double clip) {
    if (clip > 0 && count_) scale_to_norm<Backend>(gradients_.data(), count_, norm, clip);
  }
  /// Steps the shard's slices of `params` (the rank's own flat layout) with `state` at learning
  /// rate lr (r.zero()'s layout). The engine then starts the allgathers of every rank's stepped
  /// slices (r.start_gather_parameters), in flight until the next forward reaches each unit's
  /// layers (or settle()).
  template <class State, class Reduction>
  void step(State& state, T* params, const Reduction& r, float lr) {
    step_zero_slices<Backend>(state, params, gradients_.data(), r.zero(), copy_, lr);
  }

 private:
  std::size_t count_ = 0;
  buffer<T, space> gradients_;  // the shard's reduced gradients
  buffer<T, space> copy_;       // the shard's parameters, for a state that cannot step them in place
  std::vector<shard_piece> pieces_;
};

}  // namespace loom::detail
