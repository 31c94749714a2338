// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of shard_loader.hpp's non-template functions: included at the end of the
// header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include <cstdio>
#include <numeric>

#include "loom/core/random.hpp"
#include "loom/data/shard_loader.hpp"

namespace loom::data {

LOOM_DECL std::uint64_t skipped_samples::total() const noexcept {
  std::uint64_t t = 0;
  for (std::uint64_t c : by_reason) t += c;
  return t;
}

LOOM_DECL std::string skipped_samples::summary() const {
  const std::uint64_t t = total();
  if (t == 0) return {};
  std::string out = std::to_string(t) + (t == 1 ? " sample" : " samples") + " skipped:";
  bool first = true;
  for (std::size_t i = 0; i < by_reason.size(); ++i) {
    if (by_reason[i] == 0) continue;
    out += std::string(first ? " " : ", ") + std::to_string(by_reason[i]) + " " +
           describe(static_cast<sample_problem>(i));
    first = false;
  }
  return out;
}

namespace detail {

LOOM_DECL void shard_set_state::record_skip(sample_problem kind, const std::string& message) {
  constexpr std::size_t shown = 10;  // messages shown per set; the rest are counted
  const std::lock_guard<std::mutex> lock(mutex);
  ++skipped.by_reason[static_cast<std::size_t>(kind)];
  if (messages_shown < shown) {
    ++messages_shown;
    std::fprintf(stderr, "loom: skipping a bad sample (on_bad_sample::skip): %s%s\n", message.c_str(),
                 messages_shown == shown ? " (further bad samples of this set are counted, not shown)" : "");
    std::fflush(stderr);
  }
}

LOOM_DECL std::shared_ptr<shard_set_state> open_shard_set(const std::vector<std::filesystem::path>& shards,
                                                         const shard_options& o, std::size_t classes,
                                                         std::string description) {
  if (o.shuffle_window == 0)
    throw invalid_argument("loom::data::image_shards: shuffle_window must be at least 1 (1: no shuffle within a stream)");
  if (o.prefetch == 0) throw invalid_argument("loom::data::image_shards: prefetch must be at least 1 batch");
  auto st = std::make_shared<shard_set_state>();
  st->options = o;
  st->manifest = load_manifest(shards, {.cache_dir = o.cache_dir, .use_cache = o.use_cache, .on_bad = o.on_bad});
  if (description.empty()) description = shards.size() == 1 ? shards.front().string() : shards.front().string() + ", ...";
  st->description = std::move(description);
  if (st->manifest.classes > classes)
    throw data_error("loom: shards " + st->description + ": the manifest says the labels index " +
                     std::to_string(st->manifest.classes) + " classes, this data set type has " +
                     std::to_string(classes) + ": expected at most " + std::to_string(classes));
  st->streams = o.streams ? o.streams : default_streams;
  if (st->manifest.samples() == 0)
    throw data_error("loom: shards " + st->description + " hold no samples: expected at least one");
  return st;
}

}  // namespace detail
}  // namespace loom::data
