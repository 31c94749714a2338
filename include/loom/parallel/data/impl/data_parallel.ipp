// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of data_parallel.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <cstdlib>
#include <string_view>

#include "loom/parallel/data/data_parallel.hpp"

namespace loom::detail {

LOOM_DECL std::string job_field_diff(const std::string& a, const std::string& b) {
  struct field {
    std::string key, text;
  };
  auto fields = [](const std::string& s) {
    std::vector<field> out;
    std::size_t at = 0;
    while (at <= s.size()) {
      std::size_t end = s.find(';', at);
      if (end == std::string::npos) end = s.size();
      if (end > at) {
        const std::string text = s.substr(at, end - at);
        out.push_back({text.substr(0, text.find('=')), text});
      }
      at = end + 1;
    }
    return out;
  };
  auto find = [](const std::vector<field>& fs, const std::string& key) -> const field* {
    for (const auto& f : fs)
      if (f.key == key) return &f;
    return nullptr;
  };
  const auto fa = fields(a), fb = fields(b);
  std::string out;
  for (const auto& x : fa) {
    const field* y = find(fb, x.key);
    if (!y || y->text != x.text) out += " [" + (y ? y->text : x.key + "=(none)") + "] where rank 0 has [" + x.text + "]";
  }
  for (const auto& y : fb)
    if (!find(fa, y.key)) out += " [" + y.text + "] where rank 0 has [" + y.key + "=(none)]";
  return out;
}

}  // namespace loom::detail

namespace loom {

LOOM_DECL bool detail::zero_gather_overlapped_from_environment() {
  const char* v = std::getenv("LOOM_ZERO_GATHER");
  if (!v || !*v || std::string_view(v) == "overlapped") return true;
  if (std::string_view(v) == "blocking") return false;
  throw invalid_argument(std::string("loom::shard_optimizer_state: LOOM_ZERO_GATHER='") + v +
                         "' is neither 'overlapped' (the parameters' allgather overlaps the next forward) nor 'blocking'");
}

LOOM_DECL zero_layout zero_layout::make(std::span<const gradient_bucket> buckets, std::size_t rank, std::size_t ranks,
                                        std::span<const std::size_t> layer_counts) {
  zero_layout z;
  z.rank = rank;
  z.ranks = ranks;
  std::vector<std::size_t> per_rank(ranks, 0);
  for (const gradient_bucket& bk : buckets) {
    for (std::size_t j = 0; j < ranks; ++j) {
      const std::size_t lo = j * bk.count / ranks, hi = (j + 1) * bk.count / ranks;
      z.counts.push_back(hi - lo);
      per_rank[j] += hi - lo;
      if (j == rank) {
        z.begins.push_back(bk.offset + lo);
        z.shard_at.push_back(z.shard_count);
        if (hi > lo) z.pieces.push_back({.whole_offset = bk.offset + lo, .local_offset = z.shard_count, .count = hi - lo});
        z.shard_count += hi - lo;
      }
    }
  }
  for (const std::size_t n : per_rank) z.largest_shard = std::max(z.largest_shard, n);

  // The gather units: the buckets from the last (the first layers) to the first, each one's
  // layers in forward order, cut before a layer that would take a unit above the cap.
  const std::size_t cap = gather_unit_bytes / sizeof(float);
  z.layer_unit.assign(layer_counts.size(), 0);
  auto close = [&](const gather_unit& u, std::size_t b) {
    const gradient_bucket& bk = buckets[b];
    for (std::size_t j = 0; j < ranks; ++j) {  // slice j of the bucket, clipped to the unit
      const std::size_t lo = std::max(bk.offset + j * bk.count / ranks, u.offset);
      const std::size_t hi = std::min(bk.offset + (j + 1) * bk.count / ranks, u.offset + u.count);
      z.unit_counts.push_back(hi > lo ? hi - lo : 0);
    }
    for (std::size_t l = u.first_layer; l <= u.last_layer && l < z.layer_unit.size(); ++l) z.layer_unit[l] = z.units.size();
    z.units.push_back(u);
  };
  for (std::size_t b = buckets.size(); b-- > 0;) {
    const gradient_bucket& bk = buckets[b];
    if (layer_counts.empty()) {  // no layers given: one unit per bucket
      close({bk.first_layer, bk.last_layer, bk.offset, bk.count}, b);
      continue;
    }
    gather_unit u{bk.first_layer, bk.first_layer, bk.offset, 0};
    for (std::size_t l = bk.first_layer; l <= bk.last_layer; ++l) {
      if (u.count > 0 && layer_counts[l] > 0 && u.count + layer_counts[l] > cap) {
        close(u, b);
        u = {l, l, u.offset + u.count, 0};
      }
      u.last_layer = l;
      u.count += layer_counts[l];
    }
    close(u, b);
  }
  // Layers without parameters (and any outside every bucket) need no gather.
  for (std::size_t l = 0; l < layer_counts.size(); ++l)
    if (layer_counts[l] == 0) z.layer_unit[l] = z.units.size();
  return z;
}

}  // namespace loom
