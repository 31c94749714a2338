// SPDX-License-Identifier: Apache-2.0
#pragma once
// The distributed sampler: each of `world` ranks takes its own contiguous slice of every global
// batch of a seeded, shuffled epoch, and reads only those samples. It communicates nothing; every
// rank computes the same epoch order from (seed, epoch) alone.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/loader.hpp"

namespace loom::data {

/// What distributed_loader::next handed out: this rank's share of one global batch.
///
/// `global` is the size of the global batch (all ranks together), 0 only at the end of the
/// epoch; `local` is how many of its samples this rank got, which may be 0 on a short tail while
/// the epoch goes on; `offset` is the position of this rank's first sample within the global
/// batch. Converts to true while the epoch has a batch, whatever this rank's share:
///
///     while (const auto share = loader.next(x, labels)) {  // share.local may be 0
///       ... forward/backward on share.local samples, gradient sums scaled by 1 / share.global,
///       ... then the allreduce, which every rank joins, its share empty or not
///     }
struct batch_share {
  std::size_t local = 0;
  std::size_t global = 0;
  std::size_t offset = 0;

  /// False only at the end of the epoch.
  explicit operator bool() const noexcept { return global != 0; }
  bool operator==(const batch_share&) const = default;
};

/// Hands one rank of `world` its share of each global batch of a data set, in an order
/// reshuffled each epoch — the sampler of data-parallel training.
///
/// Order: epoch e visits the samples in exactly the order batch_loader<Dataset> gives for the
/// same (seed, e, shuffle) — the same function computes both — identically on every rank.
/// Global batch k covers positions [k B, min((k + 1) B, N)) of that order, B the global batch
/// and N the set's size. Of a global batch of n samples, rank r takes the contiguous positions
/// [n r / world, n (r + 1) / world): the ranks' shares, concatenated in rank order, are exactly
/// batch k of batch_loader(data, B, seed), and differ in size by at most one sample.
///
/// Uneven tail: no sample is dropped or repeated. Every rank runs batches_per_epoch() =
/// ceil(N / B) steps per epoch. When N is not a multiple of B the last global batch holds
/// N mod B samples, split as above; with fewer samples than ranks some ranks get none — they
/// must still take part in the step (join the gradient allreduce with zero gradients), which
/// is why next() tells an empty share (local == 0, global > 0) from the end of the epoch
/// (global == 0). To match a single-process run, scale each rank's gradient sum by
/// 1 / global (not 1 / local) before summing over ranks.
///
/// Reading: next() reads only this rank's samples, so over a mapped_images set a rank faults
/// in only the pages holding its own samples and no rank loads the whole set. The order
/// (N indices) is the only per-epoch state; batches allocate nothing.
///
/// The loader keeps a reference to the data set, which must outlive it.
template <class Dataset>
class distributed_loader {
  static_assert(
      image_dataset<Dataset>,
      "distributed_loader needs a data set with sample_shape, classes, size(), pixels(i), label(i) "
      "(loom::data::image_dataset, docs/data.md)");

 public:
  using sample_shape = typename Dataset::sample_shape;

  /// The loader of rank `rank` of `world` over `data`, in global batches of `global_batch`
  /// samples, positioned at the start of epoch 0. Every rank must pass the same data set size,
  /// global_batch, seed, world and shuffle (nothing here can check that the others did).
  ///
  /// Throws: loom::invalid_argument when global_batch is 0, world < 1, or rank is outside
  /// 0..world-1.
  distributed_loader(const Dataset& data, std::size_t global_batch, std::uint64_t seed, int rank,
                     int world, bool shuffle = true)
      : data_(&data),
        batch_(global_batch),
        seed_(seed),
        rank_(rank),
        world_(world),
        shuffle_(shuffle) {
    if (global_batch == 0) {
      throw invalid_argument(
          "loom: distributed_loader: expected a global batch size of at least 1, found 0");
    }
    if (world < 1) {
      throw invalid_argument(
          "loom: distributed_loader: expected a world size of at least 1, found " +
          std::to_string(world));
    }
    if (rank < 0 || rank >= world) {
      throw invalid_argument("loom: distributed_loader: expected a rank in 0.." +
                             std::to_string(world - 1) + " for a world of " +
                             std::to_string(world) + ", found " + std::to_string(rank));
    }
    order_.reserve(data.size());
    start_epoch(0);
  }
  /// A temporary data set would dangle.
  distributed_loader(const Dataset&&, std::size_t, std::uint64_t, int, int, bool = true) = delete;

  /// Restarts at the first global batch of `epoch`, in that epoch's order.
  void start_epoch(std::size_t epoch) {
    detail::epoch_order(order_, data_->size(), seed_, epoch, shuffle_);
    epoch_ = epoch;
    pos_ = 0;
    last_ = {};
  }

  /// Skips the next `batches` global batches of the epoch (a run resumed in the middle of an
  /// epoch continues where it stopped); at most to the end of the epoch.
  void skip(std::size_t batches) noexcept {
    pos_ = std::min(order_.size(), pos_ + std::min(batches, order_.size()) * batch_);
    last_ = {};
  }

  /// The number of global batches (steps) in one epoch, the same on every rank, the short last
  /// one included: ceil(size / global_batch).
  std::size_t batches_per_epoch() const noexcept { return (order_.size() + batch_ - 1) / batch_; }

  /// The global batch size given at construction.
  std::size_t global_batch() const noexcept { return batch_; }

  /// The most samples one rank gets in a step, ceil(global_batch / world): the room next()
  /// needs.
  std::size_t max_local_batch() const noexcept {
    const auto w = static_cast<std::size_t>(world_);
    if (block_) return std::min(batch_, (blocks() + w - 1) / w * block_);
    return (batch_ + w - 1) / w;
  }

  /// Deals every global batch in whole blocks of `block` positions instead of evenly: a full
  /// batch has U = ceil(global_batch / block) blocks, and rank r takes the blocks [first(r),
  /// first(r + 1)), first(r) = r floor(U / world) + min(r, U mod world) — the first U mod
  /// world ranks one more — i.e. positions [first(r) block, first(r + 1) block) of each global
  /// batch, cut at its end, so on a short batch the first ranks fill up first and the last may
  /// get none (deterministic training deals its chunks this way, block = the chunk; see
  /// loom::chunk_plan). When world blocks make a full batch, rank r takes [r block, (r + 1)
  /// block). 0 restores the even split. Takes effect at the next next().
  void set_rank_block(std::size_t block) noexcept { block_ = block; }

  /// Makes this the loader of rank `rank` of `world` from the next next() on, at the same
  /// place in the epoch (after a recovery from a failed rank the survivors share every global
  /// batch anew). Throws loom::invalid_argument as the constructor does.
  void reshard(int rank, int world) {
    if (world < 1 || rank < 0 || rank >= world)
      throw invalid_argument("loom: distributed_loader::reshard: expected a rank in 0.." + std::to_string(world - 1) +
                             " for a world of " + std::to_string(world) + ", found rank " + std::to_string(rank));
    rank_ = rank;
    world_ = world;
  }

  /// This rank and the number of ranks.
  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }

  /// The epoch started last.
  std::size_t epoch() const noexcept { return epoch_; }

  /// Writes this rank's share of the next global batch: x as (local, sample_shape::size)
  /// values pixel / 255 in [0, 1] (as batch_loader writes them), labels as local class indices.
  /// Returns the share (see batch_share): {local, global, offset}, local possibly 0 on a short
  /// tail; {0, 0, 0}, which converts to false, once the epoch is done (until start_epoch).
  ///
  /// Requires: x has room for max_local_batch() * sample_shape::size values, labels for
  /// max_local_batch() values; T is a floating-point type or constructible from float.
  /// Either may be null: that part of the samples is not read (a pipeline's last stage needs
  /// only the labels, its middle stages only the share).
  template <class T>
  batch_share next(T* x, std::int32_t* labels) {
    constexpr std::size_t sample = sample_shape::size;
    const std::size_t n = std::min(batch_, order_.size() - pos_);
    const auto w = static_cast<std::size_t>(world_);
    const auto r = static_cast<std::size_t>(rank_);
    const std::size_t lo = block_ ? std::min(n, first_block(r) * block_) : n * r / w;
    const std::size_t hi = block_ ? std::min(n, first_block(r + 1) * block_) : n * (r + 1) / w;
    for (std::size_t k = lo; k < hi; ++k) {
      const std::size_t idx = order_[pos_ + k];
      if (x != nullptr && labels != nullptr) {
        detail::write_sample(*data_, idx, x + (k - lo) * sample, labels + (k - lo));
      } else if (x != nullptr) {
        detail::write_pixels(*data_, idx, x + (k - lo) * sample);
      } else if (labels != nullptr) {
        labels[k - lo] = static_cast<std::int32_t>(data_->label(idx));
      }
    }
    pos_ += n;
    last_ = n == 0 ? batch_share{} : batch_share{hi - lo, n, lo};
    return last_;
  }

  /// next(x, labels) with the share unpacked: returns share.local (0 both for an empty share
  /// and at the end of the epoch) and sets global_n to share.global (0 only at the end of the
  /// epoch — test global_n, not the result, to find the end).
  template <class T>
  std::size_t next(T* x, std::int32_t* labels, std::size_t& global_n) {
    const batch_share share = next(x, labels);
    global_n = share.global;
    return share.local;
  }

  /// The position of this rank's first sample within the global batch next() returned last
  /// (0 before the first and after the end of the epoch): sample j of this rank's share is
  /// sample local_offset() + j of the global batch, so per-sample randomness seeded by the
  /// position in the batch is the same as in a single-process run.
  std::size_t local_offset() const noexcept { return last_.offset; }

 private:
  // set_rank_block's dealing: the blocks of a full batch, and rank r's first one.
  std::size_t blocks() const noexcept { return (batch_ + block_ - 1) / block_; }
  std::size_t first_block(std::size_t r) const noexcept {
    const auto w = static_cast<std::size_t>(world_);
    return r * (blocks() / w) + std::min(r, blocks() % w);
  }

  const Dataset* data_;
  std::size_t batch_;
  std::uint64_t seed_;
  int rank_;
  int world_;
  bool shuffle_;
  std::vector<std::size_t> order_;
  std::size_t epoch_ = 0;
  std::size_t pos_ = 0;
  std::size_t block_ = 0;  // samples per rank block; 0: the even split
  batch_share last_{};
};

/// The loader the trainer makes for Dataset: distributed_loader by default; a data set with its
/// own (image_shards: shard_loader, loom/data/shard_loader.hpp) specialises it. Every loader is
/// built as loader_for_t<Dataset>(data, global_batch, seed, rank, world, shuffle) and offers
/// distributed_loader's members (start_epoch, skip, batches_per_epoch, reshard, set_rank_block,
/// next(x, labels, global_n), local_offset, max_local_batch).
template <class Dataset>
struct loader_for {
  using type = distributed_loader<Dataset>;
};
template <class Dataset>
using loader_for_t = typename loader_for<Dataset>::type;

/// What identifies a data set's content and order beyond its size, for a checkpoint to check
/// on resume: the set's identity() when it has one (image_shards: the manifest's fingerprint,
/// the streams and the shuffle window), else "" (the IDX sets: their size says enough).
template <class Dataset>
std::string identity_of(const Dataset& data) {
  if constexpr (requires { { data.identity() } -> std::convertible_to<std::string>; }) return data.identity();
  else return {};
}

}  // namespace loom::data
