// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pieces of split-invariant (deterministic) data-parallel training, fit_options::
// deterministic_chunk: the plan that cuts every global batch into chunks and deals them to the
// ranks, the tree of aligned subtrees that sums a rank's chunk gradients in the canonical tree,
// and the exchange that finishes that tree across any number of ranks with send/recv, never
// with an allreduce or a reduce-scatter (whose orders of additions are unspecified). The
// trainer drives them; nothing here runs a forward or backward pass.
//
// The canonical tree: the gradient of a global batch of n samples is the sum of the gradients
// of its K = ceil(n / C) chunks of C consecutive samples, added in the complete binary tree over
// chunk indices padded to a power of two, where a node with one present child is that child
// (absent leaves add nothing — so the padding size does not matter). Each of its nodes is
// computed by exactly one rank, from the same operands in every world size, so every world size
// gets the same bits: a rank sums the maximal aligned subtrees inside its own range of chunks,
// and the nodes above them are finished, per range of parameters, by the rank owning that range.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"

namespace loom {

/// How deterministic mode deals the chunks of every global batch to the ranks.
///
/// A full batch of `batch` samples makes K = ceil(batch / chunk) chunks; they are dealt in
/// contiguous ranges as evenly as the count allows, the first K mod N ranks taking one more:
/// rank r holds chunks [first_chunk(r), first_chunk(r + 1)), where first_chunk(r) = r floor(K /
/// N) + min(r, K mod N) — the samples [first_chunk(r) C, first_chunk(r + 1) C) of every global
/// batch, cut short by the batch's end. So on a short tail batch the first ranks fill up first
/// and the last may get none (they still join the exchange). This is what
/// data::distributed_loader::set_rank_block(chunk) deals (rank_block()).
///
/// Supported: any batch and chunk on any number of ranks of which every one gets at least one
/// chunk of a full batch (K >= N). make() rejects the rest.
struct chunk_plan {
  std::size_t batch = 0;            // samples of a full global batch
  std::size_t chunk = 0;            // C: samples per chunk
  std::size_t ranks = 1;            // N
  std::size_t chunks_per_batch = 0; // K of a full batch
  std::size_t chunks_per_rank = 0;  // the most chunks a rank holds: ceil(K / N)

  /// The plan of `ranks` ranks training on global batches of `batch` in chunks of `chunk`.
  /// Throws loom::invalid_argument, naming batch, chunk and ranks and what would work, when
  /// chunk, batch or ranks is 0, or a full batch leaves a rank without a chunk.
  LOOM_DECL static chunk_plan make(std::size_t batch, std::size_t chunk, std::size_t ranks);

  /// Throws loom::invalid_argument when replica r's samples of a global batch of global_n
  /// (n of them, from `offset` of it) do not start where this plan deals r's first chunk: the
  /// loader does not deal as the plan says.
  void check_offset(std::size_t r, std::size_t global_n, std::size_t n, std::size_t offset) const {
    if (n > 0 && offset != chunks_of(r, global_n).first * chunk) offset_mismatch(r, global_n, offset);
  }
  /// check_offset's message (compiled once).
  [[noreturn]] LOOM_DECL void offset_mismatch(std::size_t r, std::size_t global_n, std::size_t offset) const;
  /// Throws loom::invalid_argument for deterministic_chunk `chunk` asked where the mode does not
  /// apply: with compressed gradients (`compressed`), or under a policy other than
  /// single_process and data_parallel.
  [[noreturn]] LOOM_DECL static void refuse(std::size_t chunk, bool compressed);

  /// The unit data::distributed_loader::set_rank_block deals the global batches in: the chunk.
  std::size_t rank_block() const noexcept { return chunk; }

  /// The first chunk of rank r (r <= ranks: first_chunk(ranks) = K) in a full batch.
  std::size_t first_chunk(std::size_t r) const noexcept {
    const std::size_t q = chunks_per_batch / ranks, extra = chunks_per_batch % ranks;
    return r * q + std::min(r, extra);
  }

  /// The chunks of a global batch of global_n samples: ceil(global_n / chunk).
  std::size_t chunks_in(std::size_t global_n) const noexcept { return (global_n + chunk - 1) / chunk; }

  /// The chunks [first, last) rank r holds in a global batch of global_n samples (first == last
  /// when it holds none; first is then where its range would start, cut at chunks_in(global_n)).
  std::pair<std::size_t, std::size_t> chunks_of(std::size_t r, std::size_t global_n) const noexcept {
    const std::size_t k = chunks_in(global_n);
    return {std::min(k, first_chunk(r)), std::min(k, first_chunk(r + 1))};
  }

  /// Whether the ranks [first, first + count) own any sample of a global batch of global_n
  /// samples (ranks fill in order, so: whether rank `first` does).
  bool has_samples(std::size_t first, std::size_t global_n) const noexcept {
    return first < ranks && first_chunk(first) * chunk < global_n;
  }
};

/// A node of the canonical tree: the aligned subtree of `leaves` chunks (a power of two)
/// starting at chunk `first` (a multiple of leaves).
struct tree_node {
  std::size_t first = 0, leaves = 1;
  friend bool operator==(const tree_node&, const tree_node&) = default;
};

/// The maximal aligned subtrees that the chunks [first, last) split into, left to right: the
/// nodes a rank holding those chunks computes alone (sizes grow, then shrink; at most about
/// 2 log2(last - first) of them).
LOOM_DECL std::vector<tree_node> aligned_subtrees(std::size_t first, std::size_t last);

/// Sums equally sized gradient vectors pushed in order (chunk first, first + 1, ...) in the
/// binary tree over their indices: a stack of the complete aligned subtrees pushed so far,
/// where a push whose left sibling is on top adds the two (earlier + later) and carries the
/// sum up, as often as that repeats. A push may also be a whole aligned subtree's sum (push(g,
/// leaves)); the stack then holds exactly the nodes the chunks one by one would have made.
/// After the pushes of chunks [first, last) it holds aligned_subtrees(first, last) (subtree(i));
/// from first = 0, fold() finishes the tree with them, as the tree padded to a power of two
/// with absent leaves would. Elementwise additions only, so the result does not depend on
/// threads.
template <class T, class Backend>
class gradient_tree {
  using space = typename Backend::memory_space;

 public:
  /// Forgets what was pushed; later pushes have n values each, the first one at chunk `first`.
  void reset(std::size_t n, std::size_t first = 0) {
    n_ = n;
    next_ = first;
    for (const entry& e : stack_) free_.push_back(e.slot);
    stack_.clear();
  }

  /// Whether nothing was pushed since the last reset or fold.
  bool empty() const noexcept { return stack_.empty(); }

  /// Adds g[0, n) (memory of the backend's space) as the next `leaves` chunks (a power of two:
  /// the sum of the aligned subtree starting at the next chunk, which must be a multiple of
  /// leaves); g may be overwritten after. Throws loom::invalid_argument for a subtree that is
  /// not aligned there.
  void push(const T* g, std::size_t leaves = 1) {
    if (!std::has_single_bit(leaves) || next_ % leaves != 0)
      throw invalid_argument("loom::gradient_tree::push: expected an aligned subtree of a power-of-two number of "
                             "chunks at chunk " + std::to_string(next_) + ", found " + std::to_string(leaves) +
                             " chunks");
    tree_node cur{next_, leaves};
    next_ += leaves;
    if (!stack_.empty() && sibling(stack_.back().node, cur)) {
      entry& top = stack_.back();
      Backend::for_each(n_, kernels::add<T>{data(top.slot), g, data(top.slot)});  // earlier subtree + later one
      top.node.leaves *= 2;
      carry();
      return;
    }
    const std::size_t slot = take_slot();
    Backend::copy(data(slot), g, n_);
    stack_.push_back({cur, slot});
  }

  /// Empties the tree and lets go of its memory without freeing it (buffer::abandon): after a
  /// recovery from a failed rank, sends of its subtrees may still be in flight.
  void abandon() noexcept {
    for (auto& b : slots_) b.abandon();
    slots_.clear();
    stack_.clear();
    free_.clear();
    next_ = 0;
  }

  /// The complete aligned subtrees held, left to right, and their sums (n values each).
  std::size_t subtrees() const noexcept { return stack_.size(); }
  tree_node node(std::size_t i) const noexcept { return stack_[i].node; }
  const T* subtree(std::size_t i) const noexcept { return slots_[stack_[i].slot].data(); }

  /// Writes the sum of everything pushed into out[0, n) and empties the tree. Returns false,
  /// writing nothing, when nothing was pushed. From a reset at chunk 0 this is the root of the
  /// canonical tree over the chunks pushed.
  bool fold(T* out) {
    if (stack_.empty()) return false;
    // Rightmost (smallest) subtree first: the later subtree is the right operand of every sum.
    Backend::copy(out, data(stack_.back().slot), n_);
    for (std::size_t i = stack_.size() - 1; i-- > 0;)
      Backend::for_each(n_, kernels::add<T>{data(stack_[i].slot), out, out});
    reset(n_, 0);  // empty, as after reset(n)
    return true;
  }

 private:
  struct entry {
    tree_node node;
    std::size_t slot;
  };
  // Whether b is the right sibling of a (a the left child of their parent).
  static bool sibling(const tree_node& a, const tree_node& b) noexcept {
    return a.leaves == b.leaves && a.first % (2 * a.leaves) == 0 && a.first + a.leaves == b.first;
  }
  // Adds the top into the one below while they are siblings (the stack's top just grew).
  void carry() {
    while (stack_.size() >= 2) {
      entry& right = stack_.back();
      entry& left = stack_[stack_.size() - 2];
      if (!(left.node.leaves == right.node.leaves && left.node.first % (2 * left.node.leaves) == 0)) return;
      Backend::for_each(n_, kernels::add<T>{data(left.slot), data(right.slot), data(left.slot)});
      left.node.leaves *= 2;
      free_.push_back(right.slot);
      stack_.pop_back();
    }
  }
  std::size_t take_slot() {
    std::size_t s;
    if (free_.empty()) {
      s = slots_.size();
      slots_.emplace_back();
    } else {
      s = free_.back();
      free_.pop_back();
    }
    slots_[s].reserve_discard(n_);
    return s;
  }
  T* data(std::size_t slot) noexcept { return slots_[slot].data(); }

  std::size_t n_ = 0, next_ = 0;
  std::vector<entry> stack_;
  std::vector<std::size_t> free_;
  std::vector<buffer<T, space>> slots_;
};

namespace detail {
/// The tags of deterministic mode's gradient messages (apart from any other point-to-point
/// use): the subtrees sent to the owner of a range, and the finished ranges sent back.
inline constexpr int chunk_tree_tag = 0x4c4d;  // "LM"
inline constexpr int chunk_range_tag = 0x4c4e;
}  // namespace detail

/// Finishes the canonical tree across the ranks of a communicator, any number of them.
///
/// The n values are cut into N ranges, range j = [j n / N, (j + 1) n / N), finished by rank j.
/// Every rank sends range j of each subtree it holds (aligned_subtrees of its chunks) to rank j;
/// rank j pushes everybody's, in chunk order, into a gradient_tree over range j — the canonical
/// tree's nodes above the ranks' subtrees, each added by exactly one rank, from the same
/// operands whatever N is — and folds it; then every rank sends its finished range to every
/// other (moving bytes only). A rank without chunks sends nothing but still finishes its
/// range. Uses only isend/irecv (tags detail::chunk_tree_tag, detail::chunk_range_tag).
/// Nothing is kept from one call to the next but buffers, so consecutive calls may use
/// different plans and world sizes.
///
/// Per rank and step, with m subtrees here: sends (N - 1) / N m n values and (N - 1) / N n.
template <class T, class Backend>
class chunk_exchange {
  using space = typename Backend::memory_space;

 public:
  /// Collective over comm, whose size must be plan.ranks: on entry `mine` holds this rank's
  /// subtrees of a global batch of global_n samples (reset at chunks_of(rank).first, then its
  /// chunks pushed in order; nothing when it holds none); on return out[0, n) holds the root of
  /// the canonical tree, bitwise the same on every rank and as one rank's gradient_tree over
  /// all chunks. `mine` is left as it was. Returns the bytes this rank sent. Throws
  /// loom::invalid_argument when the communicator's size is not plan.ranks, or `mine` does not
  /// hold this rank's subtrees.
  template <class Comm>
  double run(Comm& comm, const chunk_plan& plan, std::size_t global_n, const gradient_tree<T, Backend>& mine, T* out,
             std::size_t n) {
    const std::size_t world = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
    if (world != plan.ranks)
      throw invalid_argument("loom::chunk_exchange: the plan is for " + std::to_string(plan.ranks) +
                             " ranks, the communicator has " + std::to_string(world) +
                             ": call prepare_fit again after the world changed");
    const auto [first, last] = plan.chunks_of(me, global_n);
    const std::vector<tree_node> expect = aligned_subtrees(first, last);
    bool same = expect.size() == mine.subtrees();
    for (std::size_t i = 0; same && i < expect.size(); ++i) same = expect[i] == mine.node(i);
    if (!same)
      throw invalid_argument("loom::chunk_exchange: rank " + std::to_string(me) + " of " + std::to_string(world) +
                             " expected the " + std::to_string(expect.size()) + " aligned subtrees of chunks [" +
                             std::to_string(first) + ", " + std::to_string(last) + "), found " +
                             std::to_string(mine.subtrees()) + " other subtrees");
    auto lo = [&](std::size_t j) { return j * n / world; };
    const std::size_t my_lo = lo(me), my_len = lo(me + 1) - my_lo;
    // Every rank's subtrees, in chunk order: where range `me` of each comes from.
    struct source {
      tree_node node;
      std::size_t rank, index;
    };
    std::vector<source> all;
    std::size_t foreign = 0;
    for (std::size_t r = 0; r < world; ++r) {
      const auto [f, l] = plan.chunks_of(r, global_n);
      const std::vector<tree_node> nodes = aligned_subtrees(f, l);
      for (std::size_t i = 0; i < nodes.size(); ++i) all.push_back({nodes[i], r, r == me ? i : foreign++});
    }
    recv_.reserve_discard(std::max<std::size_t>(1, foreign * my_len));
    double sent = 0;
    {
      std::vector<typename Comm::request> pending;
      pending.reserve(all.size() + world * mine.subtrees());
      for (const source& s : all)
        if (s.rank != me)
          pending.push_back(comm.irecv(recv_.data() + s.index * my_len, my_len, static_cast<int>(s.rank),
                                       detail::chunk_tree_tag));
      for (std::size_t j = 0; j < world; ++j) {
        if (j == me) continue;
        const std::size_t len = lo(j + 1) - lo(j);
        for (std::size_t i = 0; i < mine.subtrees(); ++i) {
          pending.push_back(comm.isend(mine.subtree(i) + lo(j), len, static_cast<int>(j), detail::chunk_tree_tag));
          sent += double(len * sizeof(T));
        }
      }
      for (auto& p : pending) p.wait();
    }
    // The nodes above the subtrees, over range `me`: the same additions of the same operands on
    // any number of ranks.
    range_tree_.reset(my_len, 0);
    for (const source& s : all)
      range_tree_.push(s.rank == me ? mine.subtree(s.index) + my_lo : recv_.data() + s.index * my_len, s.node.leaves);
    if (!range_tree_.fold(out + my_lo)) Backend::zero(out + my_lo, my_len);  // no sample at all
    {
      std::vector<typename Comm::request> pending;
      pending.reserve(2 * world);
      for (std::size_t j = 0; j < world; ++j) {
        if (j == me) continue;
        pending.push_back(comm.irecv(out + lo(j), lo(j + 1) - lo(j), static_cast<int>(j), detail::chunk_range_tag));
      }
      for (std::size_t j = 0; j < world; ++j) {
        if (j == me) continue;
        pending.push_back(comm.isend(out + my_lo, my_len, static_cast<int>(j), detail::chunk_range_tag));
        sent += double(my_len * sizeof(T));
      }
      for (auto& p : pending) p.wait();
    }
    return sent;
  }

  /// Lets go of the receive buffer without freeing it (buffer::abandon): after a recovery from
  /// a failed rank, receives of an abandoned exchange may still write into it.
  void abandon() noexcept {
    recv_.abandon();
    range_tree_.abandon();
  }

 private:
  buffer<T, space> recv_;
  gradient_tree<T, Backend> range_tree_;
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/parallel/data/impl/chunk_tree.ipp"
#endif
