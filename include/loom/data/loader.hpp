// SPDX-License-Identifier: Apache-2.0
#pragma once
// A seeded, shuffling mini-batch iterator over an image set, in memory or mapped. The order of
// every epoch is a function of (seed, epoch) alone, identical on every platform and compiler.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/core/shape.hpp"

namespace loom::data {

/// A data set the trainer, batch_loader and distributed_loader read (docs/data.md, "Bringing
/// your own data"): labelled images of 8-bit pixels, read at random by index.
///   D::sample_shape      one sample's shape (loom::shape<C, H, W> or loom::shape<N>)
///   D::classes           static constexpr: the number of classes (labels are 0 .. classes-1)
///   d.size()             the number of samples
///   d.pixels(i)          sample i's sample_shape::size pixels, 0..255 (row-major, CHW); the
///                        loaders feed the network pixel / 255
///   d.label(i)           sample i's class
/// The trainer checks sample_shape and classes against the network at compile time.
/// loom::data::labelled_images (in memory) and mapped_images (memory-mapped IDX) are such sets.
template <class D>
concept image_dataset = requires(const D& d, std::size_t i) {
  requires shape_type<typename D::sample_shape>;
  { D::classes } -> std::convertible_to<std::size_t>;
  { d.size() } -> std::convertible_to<std::size_t>;
  { d.pixels(i) } -> std::convertible_to<const std::uint8_t*>;
  { d.label(i) } -> std::convertible_to<std::int32_t>;
};

namespace detail {

/// The random stream of epoch orders ("shuf"), apart from those of initialisation and dropout.
inline constexpr std::uint64_t shuffle_stream = 0x73687566ULL;

/// Fills `order` (resized to n; allocates only when it grows) with the order in which epoch
/// `epoch` visits samples 0..n-1: a Fisher–Yates permutation drawn from a splitmix64 generator
/// seeded from (seed, epoch) only, or index order without shuffle. batch_loader and
/// distributed_loader both take their order from here, so that they agree sample for sample.
inline void epoch_order(std::vector<std::size_t>& order, std::size_t n, std::uint64_t seed,
                        std::size_t epoch, bool shuffle) {
  order.resize(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (shuffle && n > 1) {
    splitmix64 gen(counter_hash(seed, shuffle_stream, static_cast<std::uint64_t>(epoch)));
    for (std::size_t i = n - 1; i > 0; --i) {
      const std::size_t j = static_cast<std::size_t>(gen.below(static_cast<std::uint64_t>(i) + 1));
      std::swap(order[i], order[j]);
    }
  }
}

/// Writes sample `idx` of `data` to dst as Dataset::sample_shape::size values pixel / 255: the
/// one conversion every loader uses.
template <class T, class Dataset>
void write_pixels(const Dataset& data, std::size_t idx, T* dst) {
  using compute_t = std::conditional_t<std::is_floating_point_v<T>, T, float>;
  constexpr std::size_t sample = Dataset::sample_shape::size;
  const std::uint8_t* px = data.pixels(idx);
  for (std::size_t j = 0; j < sample; ++j) {
    dst[j] = static_cast<T>(static_cast<compute_t>(px[j]) / static_cast<compute_t>(255));
  }
}

/// write_pixels, and the sample's label to *label.
template <class T, class Dataset>
void write_sample(const Dataset& data, std::size_t idx, T* dst, std::int32_t* label) {
  write_pixels(data, idx, dst);
  *label = static_cast<std::int32_t>(data.label(idx));
}

}  // namespace detail

/// Hands out a data set in mini-batches, in an order reshuffled each epoch.
///
/// Order: with shuffle, epoch e visits the samples in a Fisher–Yates permutation drawn from a
/// splitmix64 generator seeded from (seed, e) only, so the same seed and epoch give the same
/// order on every platform, and different epochs give different orders; without shuffle, in
/// index order. Every sample is visited exactly once per epoch.
///
/// Tail: no sample is dropped. With size() = q * batch + r and r > 0, the last batch of an
/// epoch holds r samples; batches_per_epoch() counts it.
///
/// The loader keeps a reference to the data set, which must outlive it. Batches allocate
/// nothing; only construction allocates (the permutation).
template <class Dataset>
class batch_loader {
  static_assert(image_dataset<Dataset>,
                "batch_loader needs a data set with sample_shape, classes, size(), pixels(i), label(i) "
                "(loom::data::image_dataset, docs/data.md)");

 public:
  using sample_shape = typename Dataset::sample_shape;
  /// The random stream of epoch orders ("shuf"), apart from those of initialisation and dropout.
  static constexpr std::uint64_t shuffle_stream = detail::shuffle_stream;

  /// A loader over `data` in batches of `batch` samples, positioned at the start of epoch 0.
  ///
  /// Throws: loom::invalid_argument when batch is 0.
  batch_loader(const Dataset& data, std::size_t batch, std::uint64_t seed, bool shuffle = true)
      : data_(&data), batch_(batch), seed_(seed), shuffle_(shuffle), order_(data.size()) {
    if (batch_ == 0) {
      throw invalid_argument("loom: batch_loader: expected a batch size of at least 1, found 0");
    }
    start_epoch(0);
  }
  /// A temporary data set would dangle.
  batch_loader(const Dataset&&, std::size_t, std::uint64_t, bool = true) = delete;

  /// Restarts at the first batch of `epoch`, in that epoch's order.
  void start_epoch(std::size_t epoch) {
    detail::epoch_order(order_, order_.size(), seed_, epoch, shuffle_);
    epoch_ = epoch;
    pos_ = 0;
  }

  /// The number of batches in one epoch, the short last one included: ceil(size / batch).
  std::size_t batches_per_epoch() const noexcept { return (order_.size() + batch_ - 1) / batch_; }

  /// The batch size given at construction.
  std::size_t batch_size() const noexcept { return batch_; }

  /// The epoch started last.
  std::size_t epoch() const noexcept { return epoch_; }

  /// Writes the next n samples of the epoch: x as (n, sample_shape::size) values pixel / 255
  /// in [0, 1], labels as n class indices. Returns n: batch, less for the last batch of the
  /// epoch when batch does not divide the size, 0 once the epoch is done (until start_epoch).
  ///
  /// Requires: x has room for batch * sample_shape::size values, labels for batch values;
  /// T is a floating-point type or constructible from float.
  template <class T>
  std::size_t next(T* x, std::int32_t* labels) {
    constexpr std::size_t sample = sample_shape::size;
    const std::size_t n = std::min(batch_, order_.size() - pos_);
    for (std::size_t k = 0; k < n; ++k) {
      detail::write_sample(*data_, order_[pos_ + k], x + k * sample, labels + k);
    }
    pos_ += n;
    return n;
  }

 private:
  const Dataset* data_;
  std::size_t batch_;
  std::uint64_t seed_;
  bool shuffle_;
  std::vector<std::size_t> order_;
  std::size_t epoch_ = 0;
  std::size_t pos_ = 0;
};

}  // namespace loom::data
