// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pieces of split-invariant (deterministic) data-parallel training, fit_options::
// deterministic_chunk: the plan that cuts every global batch into chunks and deals them to the
// ranks, the binary-counter stack that sums a rank's chunk gradients in the canonical tree, and
// the recursive-doubling exchange that finishes that tree across ranks with send/recv, never
// with an allreduce (whose order of additions is unspecified). The trainer drives them; nothing
// here runs a forward or backward pass.
//
// The canonical tree: the gradient of a global batch of n samples is the sum of the gradients
// of its K = ceil(n / C) chunks of C consecutive samples, added in the complete binary tree over
// chunk indices padded to a power of two, where a node with one present child is that child
// (absent leaves add nothing — so the padding size does not matter). Ranks own aligned subtrees
// of it, so every world size adds the same numbers in the same tree and gets the same bits.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"

namespace loom {

/// How deterministic mode deals the chunks of every global batch to the ranks.
///
/// A full batch of `batch` samples makes K = ceil(batch / chunk) chunks; the tree over them is
/// padded to P = the least power of two >= max(K, ranks) leaves, and rank r owns the aligned
/// subtree of S = P / ranks chunks starting at chunk r S: the samples [r S C, (r + 1) S C) of
/// every global batch, cut short by the batch's end. When K is a power of two and a multiple of
/// ranks every rank gets K / ranks chunks; otherwise the last ranks get fewer, and on a short
/// tail batch the first ranks fill up first and the last may get none (they still join the
/// exchange).
///
/// Supported: any batch and chunk, with a power-of-two number of ranks of which every one gets
/// at least one chunk of a full batch ((ranks - 1) S < K). make() rejects the rest.
struct chunk_plan {
  std::size_t batch = 0;            // samples of a full global batch
  std::size_t chunk = 0;            // C: samples per chunk
  std::size_t ranks = 1;            // N
  std::size_t chunks_per_batch = 0; // K of a full batch
  std::size_t chunks_per_rank = 0;  // S

  /// The plan of `ranks` ranks training on global batches of `batch` in chunks of `chunk`.
  /// Throws loom::invalid_argument, naming batch, chunk and ranks and what would work, when
  /// chunk or batch is 0, ranks is not a power of two, or a full batch leaves a rank without a
  /// chunk.
  static chunk_plan make(std::size_t batch, std::size_t chunk, std::size_t ranks) {
    const std::string where = "loom::trainer::fit: deterministic_chunk=" + std::to_string(chunk) + " with batch=" +
                              std::to_string(batch) + " on " + std::to_string(ranks) + " rank" +
                              (ranks == 1 ? "" : "s") + ": ";
    if (chunk == 0 || batch == 0)
      throw invalid_argument(where + "expected a chunk and a batch of at least 1 sample (0 turns the mode off)");
    if (!std::has_single_bit(ranks)) {
      const std::size_t below = std::bit_floor(ranks), above = std::bit_ceil(ranks);
      throw invalid_argument(where + "deterministic mode needs a power-of-two number of ranks (1, 2, 4, 8, ...), "
                             "found " + std::to_string(ranks) + ": run on " + std::to_string(below) + " or " +
                             std::to_string(above) + " ranks, or set deterministic_chunk = 0");
    }
    chunk_plan p;
    p.batch = batch;
    p.chunk = chunk;
    p.ranks = ranks;
    p.chunks_per_batch = (batch + chunk - 1) / chunk;
    const std::size_t leaves = std::bit_ceil(std::max(p.chunks_per_batch, ranks));
    p.chunks_per_rank = leaves / ranks;
    if ((ranks - 1) * p.chunks_per_rank >= p.chunks_per_batch) {
      const std::size_t idle = ranks - (p.chunks_per_batch + p.chunks_per_rank - 1) / p.chunks_per_rank;
      throw invalid_argument(where + "a full batch makes " + std::to_string(p.chunks_per_batch) + " chunk" +
                             (p.chunks_per_batch == 1 ? "" : "s") + " of at most " + std::to_string(chunk) +
                             " samples, which leaves " + std::to_string(idle) + " rank" + (idle == 1 ? "" : "s") +
                             " without samples in every step: expected at least one chunk per rank; use a chunk of "
                             "at most " + std::to_string(std::max<std::size_t>(1, batch / ranks)) +
                             " samples (batch / ranks), or fewer ranks");
    }
    return p;
  }

  /// Samples of the block each rank owns in every global batch: S C.
  std::size_t rank_block() const noexcept { return chunks_per_rank * chunk; }

  /// Whether the ranks [first, first + count) own any sample of a global batch of global_n
  /// samples (ranks fill in order, so: whether rank `first` does).
  bool has_samples(std::size_t first, std::size_t global_n) const noexcept { return first * rank_block() < global_n; }
};

/// Sums equally sized gradient vectors pushed in order (chunk 0, 1, 2, ...) in the binary tree
/// over their indices: a binary counter of log2(count) + 1 buffers, where a push that finds its
/// level taken adds the two (earlier + later) and carries the sum up a level. fold() finishes
/// the tree with the partial subtrees, as the tree padded to a power of two with absent leaves
/// would. Elementwise additions only, so the result does not depend on threads.
template <class T, class Backend>
class gradient_tree {
  using space = typename Backend::memory_space;

 public:
  /// Forgets what was pushed; later pushes have n values each.
  void reset(std::size_t n) {
    n_ = n;
    taken_ = 0;
  }

  /// Whether nothing was pushed since the last reset or fold.
  bool empty() const noexcept { return taken_ == 0; }

  /// Adds g[0, n) (memory of the backend's space) as the next leaf; g may be overwritten after.
  void push(const T* g) {
    std::size_t l = 0;
    const T* carry = g;
    while (taken_ >> l & 1u) {
      T* node = level(l);
      Backend::for_each(n_, kernels::add<T>{node, carry, node});  // earlier subtree + later one
      taken_ &= ~(std::uint64_t{1} << l);
      carry = node;
      ++l;
    }
    if (l == 0) {
      Backend::copy(level(0), g, n_);
    } else {
      level(l);  // allocated now, it becomes level l - 1's free buffer
      std::swap(levels_[l], levels_[l - 1]);  // the sum moves up
    }
    taken_ |= std::uint64_t{1} << l;
  }

  /// Writes the sum of everything pushed into out[0, n) and empties the tree. Returns false,
  /// writing nothing, when nothing was pushed.
  bool fold(T* out) {
    if (taken_ == 0) return false;
    bool first = true;
    for (std::size_t l = 0; l < 64; ++l) {
      if (!(taken_ >> l & 1u)) continue;
      // Lowest level first: the latest (rightmost) subtree is the right operand of every sum.
      if (first)
        Backend::copy(out, level(l), n_);
      else
        Backend::for_each(n_, kernels::add<T>{level(l), out, out});
      first = false;
    }
    taken_ = 0;
    return true;
  }

 private:
  T* level(std::size_t l) {
    while (levels_.size() <= l) levels_.emplace_back();
    levels_[l].reserve_discard(n_);
    return levels_[l].data();
  }

  std::size_t n_ = 0;
  std::uint64_t taken_ = 0;  // bit l: levels_[l] holds a full subtree of 2^l leaves
  std::vector<buffer<T, space>> levels_;
};

namespace detail {
/// The tag of deterministic mode's gradient messages (apart from any other point-to-point use).
inline constexpr int chunk_tree_tag = 0x4c4d;  // "LM"
}  // namespace detail

/// Finishes the canonical tree across the ranks of `comm` (a power-of-two size): on entry each
/// rank holds in data[0, n) the sum of its own subtree, or nothing when has_samples(rank, 1) is
/// false; on return every rank holds the root, bitwise the same everywhere. Recursive doubling:
/// in round i rank r and r xor 2^i, each holding the sum of its block of 2^i ranks, exchange
/// and add (lower block + upper block); a block without samples sends nothing and takes the
/// other's sum. Uses only send/recv (tag detail::chunk_tree_tag); scratch holds n values.
/// Collective. Returns the bytes this rank sent.
template <class T, class Backend, class Comm, class HasSamples>
double tree_allreduce(Comm& comm, T* data, T* scratch, std::size_t n, HasSamples&& has_samples) {
  const std::size_t world = static_cast<std::size_t>(comm.size()), rank = static_cast<std::size_t>(comm.rank());
  double sent = 0;
  for (std::size_t half = 1; half < world; half <<= 1) {
    const std::size_t peer = rank ^ half;
    const std::size_t mine = rank & ~(half - 1), theirs = peer & ~(half - 1);  // first rank of each block
    const bool have = has_samples(mine, half), get = has_samples(theirs, half);
    const int p = static_cast<int>(peer);
    if (have && get) {
      auto out = comm.isend(data, n, p, detail::chunk_tree_tag);
      comm.recv(scratch, n, p, detail::chunk_tree_tag);
      out.wait();
      // The same sum on both sides: float addition is commutative, and both add the lower
      // block's sum to the upper block's.
      if (rank < peer)
        Backend::for_each(n, kernels::add<T>{data, scratch, data});
      else
        Backend::for_each(n, kernels::add<T>{scratch, data, data});
      sent += double(n * sizeof(T));
    } else if (get) {
      comm.recv(data, n, p, detail::chunk_tree_tag);
    } else if (have) {
      comm.send(data, n, p, detail::chunk_tree_tag);
      sent += double(n * sizeof(T));
    }
  }
  return sent;
}

}  // namespace loom
