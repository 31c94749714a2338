// SPDX-License-Identifier: Apache-2.0
#pragma once
// The arithmetic of the shard loader's order — shards dealt into virtual streams, windows
// shuffled within a stream, each global batch split over the streams in proportion to their
// sizes — and the reader of one stream's samples. No threads and no decoding here (those are
// shard_loader.hpp's); every function is a pure function of its arguments, so every rank
// computes the same. Design: docs/data.md, "The loader".

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/data/shards.hpp"
#include "loom/data/tar.hpp"

namespace loom::data {
namespace detail {

/// The random streams of the shards' order and of the windows' orders, apart from those of
/// initialisation, dropout and the IDX loaders' shuffle.
inline constexpr std::uint64_t shard_order_stream = 0x73686f72ULL;   // "shor"
inline constexpr std::uint64_t window_order_stream = 0x77696e64ULL;  // "wind"

/// The order in which streams win ties when shards are dealt: the bit-reversal permutation of
/// 0..streams-1 (0, 8, 4, 12, ... for 16), so that the streams that get one shard more are
/// spread over the stream range and every contiguous block of streams — a rank's — gets its
/// proportional share to within one shard.
LOOM_DECL std::vector<std::size_t> stream_tie_order(std::size_t streams);

/// One epoch's dealing of the shards into streams.
///
/// `shards[v]` are stream v's shards (indices into the set) in reading order, `starts[v][j]`
/// the stream position of the first sample of its j-th shard (with n_v at the end), and
/// `samples[v]` = n_v.
struct stream_layout {
  std::vector<std::vector<std::uint32_t>> shards;
  std::vector<std::vector<std::uint64_t>> starts;
  std::vector<std::uint64_t> samples;
};

/// Deals the shards (their sample counts `counts`) into `streams` streams for one epoch: in
/// the order of a Fisher–Yates permutation drawn from (seed, epoch) (the set's order without
/// shuffle), each shard goes to the stream with the fewest samples so far, ties to the first in
/// stream_tie_order. Streams then differ by at most the largest shard.
LOOM_DECL stream_layout deal_shards(std::span<const std::uint64_t> counts, std::size_t streams, std::uint64_t seed,
                                    std::uint64_t epoch, bool shuffle);

/// How an epoch's samples are split over the steps: seat h of the epoch (h = 0..N-1; step k
/// takes seats [k B, (k + 1) B)) goes to the stream with the highest Sainte-Laguë priority
/// n_v / (2 taken_v + 1) among those not yet exhausted, ties to the lowest stream. So every
/// step takes B samples (the last one the rest), stream v about B n_v / N of them, and every
/// stream ends with the epoch's last step. A function of the stream sizes alone.
class batch_split {
 public:
  /// Back to seat 0 of an epoch whose streams hold `samples`.
  LOOM_DECL void reset(std::span<const std::uint64_t> samples);
  /// Gives out seats up to `seat` (at most the epoch's total). Requires seat >= seats().
  LOOM_DECL void advance_to(std::uint64_t seat);
  /// Seats given out so far, and how many of them each stream took.
  std::uint64_t seats() const noexcept { return seats_; }
  const std::vector<std::uint64_t>& taken() const noexcept { return taken_; }

 private:
  bool before(std::size_t a, std::size_t b) const noexcept;
  std::vector<std::uint64_t> n_, taken_;
  std::vector<std::size_t> heap_;  // the streams not exhausted, highest priority first
  std::uint64_t seats_ = 0, total_ = 0;
};

/// The arithmetic of one shard set's epochs: which stream positions step k takes, which sample
/// a stream position is, which shard holds it. Stateless but for caches; one per thread.
class shard_schedule {
 public:
  LOOM_DECL shard_schedule(std::vector<std::uint64_t> counts, std::size_t streams, std::size_t window,
                           std::size_t batch, std::uint64_t seed, bool shuffle);

  std::size_t streams() const noexcept { return streams_; }
  std::size_t batch() const noexcept { return batch_; }
  std::uint64_t samples() const noexcept { return total_; }
  /// ceil(N / B): every step but the last takes B samples.
  std::size_t steps_per_epoch() const noexcept { return static_cast<std::size_t>((total_ + batch_ - 1) / batch_); }

  /// Deals epoch `e` (a no-op when it is the epoch dealt last).
  LOOM_DECL void set_epoch(std::size_t e);
  std::size_t epoch() const noexcept { return epoch_; }
  const stream_layout& layout() const noexcept { return layout_; }

  /// For every stream v, the stream positions [first, second) that step k of the epoch takes.
  LOOM_DECL void step_ranges(std::size_t k, std::vector<std::pair<std::uint64_t, std::uint64_t>>& out);

  /// The stream sample at position p of stream v: p's window permuted by (seed, epoch, v, window).
  LOOM_DECL std::uint64_t sample_at(std::size_t v, std::uint64_t p);

  /// Which shard of stream v holds its stream sample q: (j, its position in stream v's list, and
  /// the sample's index within the shard).
  struct place {
    std::size_t slot = 0;
    std::uint32_t shard = 0;
    std::uint64_t member = 0;
  };
  LOOM_DECL place locate(std::size_t v, std::uint64_t q) const;

  /// The index in the set of shard s's first sample.
  std::uint64_t first_index(std::uint32_t s) const noexcept { return first_[s]; }
  std::uint64_t shard_samples(std::uint32_t s) const noexcept { return counts_[s]; }
  std::size_t window() const noexcept { return window_; }

 private:
  std::vector<std::uint64_t> counts_, first_;
  std::size_t streams_, window_, batch_;
  std::uint64_t seed_;
  bool shuffle_;
  std::uint64_t total_ = 0;
  std::size_t epoch_ = static_cast<std::size_t>(-1);
  stream_layout layout_;
  batch_split split_;
  std::size_t split_step_ = 0;  // split_ stands at the start of this step
  std::vector<std::uint64_t> perm_window_;  // per stream: the window perm_ holds (-1: none)
  std::vector<std::vector<std::uint32_t>> perm_;
};

/// One sample as read from its shard, before decoding.
struct fetched_sample {
  std::vector<std::byte> image;  // empty unless asked for
  std::int32_t label = -1;
  std::uint64_t index = 0;       // in the set
  std::uint32_t shard = 0;       // in the set
  std::string member;            // the image member's name (else the key), for messages
  std::uint64_t offset = 0;      // its header's byte offset
  std::string problem;           // "" for a good sample, else the sentence
  sample_problem kind = sample_problem::none;
};

/// "loom: shard FILE: member NAME at byte OFFSET", for a message about a fetched sample.
LOOM_DECL std::string describe_sample(const shard_manifest& m, const fetched_sample& f);

/// Reads one stream's samples for the loader, a window at a time, each window's samples read in
/// stream order (shard after shard, sequentially; a shard entered in the middle is read forward
/// from its start without keeping the images before).
class stream_reader {
 public:
  stream_reader(const shard_manifest& m, std::size_t classes, std::size_t read_size)
      : manifest_(&m), classes_(classes), read_size_(read_size) {}

  /// Forgets the loaded window (its samples may have been taken by batches since thrown away).
  void forget_window() noexcept {
    window_ = static_cast<std::uint64_t>(-1);
    samples_.clear();
  }
  /// Forgets everything (another epoch or another stream).
  void reset() noexcept {
    forget_window();
    close();
  }

  /// Stream v's stream sample q, moved out of the window that holds it (loaded when needed,
  /// with the images when want_image). Never throws for bad input: a problem is in the sample.
  LOOM_DECL fetched_sample take(shard_schedule& s, std::size_t v, std::uint64_t q, bool want_image);

  /// Bytes read from shards by this reader so far.
  std::uint64_t bytes_read() const noexcept { return bytes_done_ + (reader_ ? reader_->reader().bytes_read() : 0); }

 private:
  LOOM_DECL fetched_sample read(shard_schedule& s, std::size_t v, std::uint64_t q, bool want_image);
  void close() noexcept {
    if (reader_) bytes_done_ += reader_->reader().bytes_read();
    reader_.reset();
    slot_ = static_cast<std::size_t>(-1);
    broken_.clear();
  }

  const shard_manifest* manifest_;
  std::size_t classes_, read_size_;
  std::uint64_t window_ = static_cast<std::uint64_t>(-1);
  bool window_images_ = false;
  std::vector<fetched_sample> samples_;
  // The cursor: the shard open (its slot in the stream's list) and its next sample.
  std::optional<tar_sample_reader> reader_;
  std::size_t slot_ = static_cast<std::size_t>(-1);
  std::uint32_t shard_ = 0;
  std::uint64_t next_member_ = 0;
  std::string broken_;  // why the rest of the open shard cannot be read
  sample_problem broken_kind_ = sample_problem::none;
  std::uint64_t bytes_done_ = 0;
};

}  // namespace detail
}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/shard_schedule.ipp"
#endif
