// SPDX-License-Identifier: Apache-2.0
#pragma once
// The gradient bucket plan of data parallelism, computed by the compiler from the network
// type: layers taken last to first (the order backward finishes them) are grouped into buckets
// of at most a cap in bytes. Layers' gradients are contiguous in the flat buffer, so a bucket
// is one plain range of it — allreduced in place, without copies.

#include <array>
#include <cstddef>

namespace loom {

/// One bucket: the gradients [offset, offset + count) of layers [first_layer, last_layer]. Its
/// allreduce can start once backward has finished layer ready_after (the lowest layer of the
/// bucket that has parameters).
struct gradient_bucket {
  std::size_t first_layer = 0, last_layer = 0;
  std::size_t offset = 0, count = 0;
  std::size_t ready_after = 0;
};

namespace detail {
/// Walks the layers last to first and calls emit(bucket) for each closed bucket.
template <std::size_t L, class Emit>
constexpr void plan_buckets(const std::array<std::size_t, L>& counts, const std::array<std::size_t, L>& offsets,
                            std::size_t first_cap_elements, std::size_t cap_elements, Emit&& emit) {
  bool open = false;
  std::size_t emitted = 0;
  gradient_bucket b{};
  for (std::size_t k = L; k-- > 0;) {
    if (counts[k] == 0) continue;  // parameter-free layers belong to no bucket
    if (open && b.count + counts[k] > (emitted == 0 ? first_cap_elements : cap_elements)) {
      emit(b);
      ++emitted;
      open = false;
    }
    if (!open) {
      b = gradient_bucket{k, k, offsets[k], 0, k};
      open = true;
    }
    b.first_layer = k;
    b.ready_after = k;
    b.offset = offsets[k];
    b.count += counts[k];
  }
  if (open) emit(b);
}
}  // namespace detail

/// The default cap of the first bucket, as PyTorch DDP's: small, so that communication starts
/// as soon as the last layers are done.
inline constexpr std::size_t default_first_bucket_bytes = std::size_t{1} << 20;

/// The bucket plan of Network for scalar T and a cap of CapBytes per bucket (FirstCapBytes for
/// the first one to become ready). A layer larger than the cap gets a bucket of its own.
/// Buckets are listed in the order they become ready.
template <class Network, class T, std::size_t CapBytes,
          std::size_t FirstCapBytes = (CapBytes < default_first_bucket_bytes ? CapBytes : default_first_bucket_bytes)>
struct bucket_plan {
  static_assert(CapBytes >= sizeof(T) && FirstCapBytes >= sizeof(T),
                "loom::bucket_bytes<N>: the bucket cap must hold at least one scalar");
  static constexpr std::size_t cap_elements = CapBytes / sizeof(T);
  static constexpr std::size_t first_cap_elements = FirstCapBytes / sizeof(T);

  static constexpr std::size_t count = [] {
    std::size_t n = 0;
    detail::plan_buckets(Network::parameter_counts, Network::parameter_offsets, first_cap_elements, cap_elements,
                         [&](const gradient_bucket&) { ++n; });
    return n;
  }();

  static constexpr std::array<gradient_bucket, count> buckets = [] {
    std::array<gradient_bucket, count> out{};
    std::size_t n = 0;
    detail::plan_buckets(Network::parameter_counts, Network::parameter_offsets, first_cap_elements, cap_elements,
                         [&](const gradient_bucket& b) { out[n++] = b; });
    return out;
  }();

  /// For each layer, the bucket whose allreduce starts when that layer's backward is done, or
  /// count (none).
  static constexpr std::array<std::size_t, Network::layer_count> starts_after_layer = [] {
    std::array<std::size_t, Network::layer_count> s{};
    for (auto& v : s) v = count;
    for (std::size_t b = 0; b < count; ++b) s[buckets[b].ready_after] = b;
    return s;
  }();
};

}  // namespace loom
