// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of data_parallel.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/parallel/data_parallel.hpp"

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

LOOM_DECL zero_layout zero_layout::make(std::span<const gradient_bucket> buckets, std::size_t rank, std::size_t ranks) {
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
  return z;
}

}  // namespace loom
