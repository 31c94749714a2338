// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::shard_map: what one rank holds of the whole model — which blocks of the whole network's
// flat parameter layout (Network::parameter_offsets) lie where in this rank's own flat buffer,
// and as which replica, stage and slice. Every engine gives one (engine::shard()); checkpoints,
// resharding and optimizer-state sharding read it. The blocks are compile-time values wherever
// the policy fixes them (the whole model, a pipeline stage, a tensor slice): shards::whole,
// shards::stage, shards::slice below, which tests static_assert; the network's buffers (running
// statistics) likewise, shards::whole_buffers and shards::stage_buffers. Optimizer state buffers that
// are laid out as the parameters (SGD's momentum, Adam's two moments) are described by the
// same blocks. No communication here.

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <vector>

namespace loom {

/// A block of the whole network's flat parameter layout that a rank holds: `rows` runs of
/// `count` consecutive values; run i starts at whole_offset + i * whole_stride in the whole
/// layout and at local_offset + i * local_stride in the rank's own buffer. One run (rows = 1)
/// is a plain range; several are a column block of a row-major matrix (a row_parallel weight).
struct shard_piece {
  std::size_t whole_offset = 0, local_offset = 0, count = 0;
  std::size_t rows = 1, whole_stride = 0, local_stride = 0;
  /// Every slice of the tensor-parallel group holds this block too (a replicated layer, a
  /// row_parallel bias): one copy of it is the model's.
  bool shared = false;

  constexpr std::size_t size() const noexcept { return rows * count; }
  friend constexpr bool operator==(const shard_piece&, const shard_piece&) = default;
};

/// What this rank holds of the whole model, and its place in the grid of ranks.
struct shard_map {
  /// Data-parallel replica (0 .. replicas - 1): replicas hold the same values.
  int replica = 0, replicas = 1;
  /// Pipeline stage (0 .. stages - 1) and tensor-parallel slice (0 .. slices - 1).
  int stage = 0, stages = 1;
  int slice = 0, slices = 1;
  /// Values in the whole model (Network::parameter_count) and in this rank's buffer.
  std::size_t whole_count = 0, local_count = 0;
  /// The blocks this rank holds; together they cover its whole buffer once.
  std::span<const shard_piece> pieces{};
  /// The same for the network's buffers (batch norm's running statistics: Network::buffer_count
  /// values in the whole network's flat buffer of buffers, local_buffer_count in this rank's):
  /// a replica's, a stage's own, every tensor slice's whole copy (shared). Each replica keeps
  /// its own running statistics; replica 0's (and slice 0's) are the ones written.
  std::size_t whole_buffer_count = 0, local_buffer_count = 0;
  std::span<const shard_piece> buffer_pieces{};

  /// Whether this rank is the one to write `p` when every rank writes what it holds once
  /// (a checkpoint): replica 0 only, and a shared block from slice 0 only.
  constexpr bool writes(const shard_piece& p) const noexcept { return replica == 0 && (!p.shared || slice == 0); }
};

/// Copies this rank's values local[0, map.local_count) into their places of whole (the whole
/// network's flat layout, Network::parameter_count values). Host memory.
template <class T>
void copy_to_whole(const shard_map& map, const T* local, T* whole) {
  for (const shard_piece& p : map.pieces)
    for (std::size_t i = 0; i < p.rows; ++i)
      for (std::size_t k = 0; k < p.count; ++k)
        whole[p.whole_offset + i * p.whole_stride + k] = local[p.local_offset + i * p.local_stride + k];
}

/// The inverse: this rank's values from the whole network's flat layout (e.g. a checkpoint
/// written by another world size). Host memory.
template <class T>
void copy_from_whole(const shard_map& map, const T* whole, T* local) {
  for (const shard_piece& p : map.pieces)
    for (std::size_t i = 0; i < p.rows; ++i)
      for (std::size_t k = 0; k < p.count; ++k)
        local[p.local_offset + i * p.local_stride + k] = whole[p.whole_offset + i * p.whole_stride + k];
}

/// The blocks `outer` (the whole layout -> a rank's buffer L: a tensor slice's, a pipeline
/// stage's) seen through `inner` (plain ranges of L -> a smaller buffer B: ZeRO's shard of L,
/// zero_layout::pieces): where each value of B lies in the whole layout, as blocks of B. Each
/// outer block must be one run of L (one row, or rows laid end to end: local_stride = count),
/// as every loom shard's are; a block's `shared` carries over. A row_parallel weight's column
/// block cut by a range becomes at most three blocks: a partial row, whole rows, a partial row.
inline std::vector<shard_piece> compose(std::span<const shard_piece> outer, std::span<const shard_piece> inner) {
  std::vector<shard_piece> out;
  for (const shard_piece& q : inner) {
    const std::size_t q0 = q.whole_offset, q1 = q0 + q.count * q.rows;
    for (const shard_piece& p : outer) {
      const std::size_t p0 = p.local_offset, p1 = p0 + p.size();
      const std::size_t a = std::max(p0, q0), b = std::min(p1, q1);
      if (a >= b) continue;
      const auto in_b = [&](std::size_t x) { return q.local_offset + (x - q0); };
      if (p.rows == 1) {
        out.push_back({.whole_offset = p.whole_offset + (a - p0), .local_offset = in_b(a), .count = b - a, .shared = p.shared});
        continue;
      }
      const std::size_t c = p.count;
      const auto at = [&](std::size_t x) { return p.whole_offset + (x - p0) / c * p.whole_stride + (x - p0) % c; };
      std::size_t x = a;
      if ((x - p0) % c != 0) {  // the end of a row
        const std::size_t e = std::min(b, p0 + ((x - p0) / c + 1) * c);
        out.push_back({.whole_offset = at(x), .local_offset = in_b(x), .count = e - x, .shared = p.shared});
        x = e;
      }
      if (const std::size_t rows = (b - x) / c; rows > 0) {  // whole rows
        out.push_back({.whole_offset = at(x), .local_offset = in_b(x), .count = c, .rows = rows,
                       .whole_stride = p.whole_stride, .local_stride = c, .shared = p.shared});
        x += rows * c;
      }
      if (x < b)  // the start of a row
        out.push_back({.whole_offset = at(x), .local_offset = in_b(x), .count = b - x, .shared = p.shared});
    }
  }
  return out;
}

namespace shards {

/// The whole model in one block (single_process, data_parallel).
template <class Network>
inline constexpr std::array<shard_piece, 1> whole{{{.whole_offset = 0, .local_offset = 0, .count = Network::parameter_count}}};

/// The whole network's buffers in one block (a replica), shared by the slices of a tensor-
/// parallel group when Shared (each holds them whole).
template <class Network, bool Shared = false>
inline constexpr std::array<shard_piece, Network::buffer_count ? 1 : 0> whole_buffers = [] {
  std::array<shard_piece, Network::buffer_count ? 1 : 0> a{};
  if constexpr (Network::buffer_count > 0) a[0] = {.whole_offset = 0, .local_offset = 0, .count = Network::buffer_count, .shared = Shared};
  return a;
}();

/// Pipeline stage Stage of Partition (a loom::stage_partition): its layers' buffers, one block
/// at the stage's offset in the whole network's flat buffer of buffers.
template <class Partition, std::size_t Stage>
inline constexpr std::array<shard_piece, Partition::buffer_counts[Stage] ? 1 : 0> stage_buffers = [] {
  std::array<shard_piece, Partition::buffer_counts[Stage] ? 1 : 0> a{};
  if constexpr (Partition::buffer_counts[Stage] > 0)
    a[0] = {.whole_offset = Partition::buffer_offsets[Stage], .local_offset = 0, .count = Partition::buffer_counts[Stage]};
  return a;
}();

/// Pipeline stage Stage of Partition (a loom::stage_partition): its layers' parameters, one
/// block at the stage's offset.
template <class Partition, std::size_t Stage>
inline constexpr std::array<shard_piece, 1> stage{
    {{.whole_offset = Partition::parameter_offsets[Stage], .local_offset = 0, .count = Partition::parameter_counts[Stage]}}};

namespace detail {
/// The blocks of tensor slice S of Layout (a loom::tensor_parallel_layout<Network, Width>):
/// a replicated layer whole (shared); a column_parallel layer its W rows and its b entries; a
/// row_parallel layer its W columns (one run per row) and the whole b (shared).
template <class Layout, std::size_t S>
constexpr auto slice_pieces() {
  using kind = typename Layout::kind;
  constexpr std::size_t count = [] {
    std::size_t n = 0;
    for (const auto& p : Layout::pieces) n += p.role == kind::replicated ? (p.whole_count > 0 ? 1 : 0) : 2;
    return n;
  }();
  std::array<shard_piece, count> out{};
  std::size_t k = 0;
  for (const auto& p : Layout::pieces) {
    if (p.role == kind::replicated) {
      if (p.whole_count > 0)
        out[k++] = {.whole_offset = p.whole_offset, .local_offset = p.rank_offset, .count = p.whole_count, .shared = true};
    } else if (p.role == kind::column) {
      const std::size_t rows = p.rank_count / (p.cols + 1);  // the slice's rows: W (rows, cols) and b (rows)
      out[k++] = {.whole_offset = p.whole_offset + S * rows * p.cols, .local_offset = p.rank_offset, .count = rows * p.cols};
      out[k++] = {.whole_offset = p.whole_offset + p.rows * p.cols + S * rows, .local_offset = p.rank_offset + rows * p.cols,
                  .count = rows};
    } else {
      const std::size_t cols = (p.rank_count - p.rows) / p.rows;  // the slice's columns of W (rows, cols)
      out[k++] = {.whole_offset = p.whole_offset + S * cols, .local_offset = p.rank_offset, .count = cols, .rows = p.rows,
                  .whole_stride = p.cols, .local_stride = cols};
      out[k++] = {.whole_offset = p.whole_offset + p.rows * p.cols, .local_offset = p.rank_offset + p.rows * cols,
                  .count = p.rows, .shared = true};
    }
  }
  return out;
}
}  // namespace detail

/// Tensor-parallel slice Slice of Layout (a loom::tensor_parallel_layout<Network, Width>).
template <class Layout, std::size_t Slice>
inline constexpr auto slice = detail::slice_pieces<Layout, Slice>();

/// The values a set of blocks covers in the rank's buffer (each block once).
template <std::size_t N>
constexpr std::size_t local_size(const std::array<shard_piece, N>& pieces) {
  std::size_t n = 0;
  for (const auto& p : pieces) n += p.size();
  return n;
}

}  // namespace shards
}  // namespace loom
