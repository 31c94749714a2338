// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fashion-MNIST as WebDataset tar shards for the main example: `--data DIR` where DIR holds
// train-*.tar and test-*.tar (loom-shards --idx writes them, docs/data.md) is read through
// loom::data::image_shards instead of the IDX files, with the flags below. Needs the image
// component (loom::images, LOOM_HAS_IMAGES).

#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>

#include "example.hpp"
#include "loom/data/image_pipeline.hpp"
#include "loom/data/shard_loader.hpp"

namespace example {

/// 28 x 28 grey PNG or JPEG files, decoded to pixel / 255: bit for bit what the IDX path gives.
using fashion_shards = loom::data::image_shards<loom::data::decode_to<1, 28, 28>, 10>;

inline constexpr const char* shards_usage = R"(  --data DIR             with train-*.tar and test-*.tar in DIR (loom-shards --idx ... --out DIR),
                         the shards are read instead of the IDX files (docs/data.md):
  --shard-streams V      virtual streams the shards are dealt into (default 16; at least the
                         number of ranks; keep it fixed over a job's restarts)
  --shuffle-window K     samples shuffled together within a stream (default 1000)
  --on-bad-sample fail|skip  a bad sample ends the run (default) or is left out and counted
  --decode-threads N     threads decoding per rank (default: the cores the compute pool leaves, >= 1)
)";

/// The shard flags (the example's own: parser's `extra`).
struct shard_flags {
  loom::data::shard_options options;
  /// Takes one of the flags above; false when `name` is none of them.
  bool take(const parser& p, std::string_view name, std::string_view value) {
    if (name == "shard-streams") options.streams = p.number<std::size_t>(name, value);
    else if (name == "shuffle-window") options.shuffle_window = p.number<std::size_t>(name, value);
    else if (name == "decode-threads") options.decode_threads = p.number<std::size_t>(name, value);
    else if (name == "on-bad-sample") {
      if (value != "fail" && value != "skip") p.fail("--on-bad-sample must be fail or skip, got '" + std::string(value) + "'");
      options.on_bad = value == "skip" ? loom::data::on_bad_sample::skip : loom::data::on_bad_sample::fail;
    } else {
      return false;
    }
    return true;
  }
};

/// Whether dir holds shards of both splits.
inline bool has_shards(const std::string& dir) {
  bool train = false, test = false;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() <= 4 || n.compare(n.size() - 4, 4, ".tar") != 0) continue;
    train = train || n.rfind("train-", 0) == 0;
    test = test || n.rfind("test-", 0) == 0;
  }
  return train && test;
}

/// The split's shards under f.data.
inline fashion_shards load_shards(const flags& f, loom::data::split which, const loom::data::shard_options& o) {
  if (f.train_samples || f.test_samples)
    throw loom::invalid_argument("--train-samples and --test-samples take the first samples of the IDX files; with "
                                 "shards in --data, convert fewer samples instead (loom-shards --limit N)");
  return fashion_shards(f.data, loom::data::to_string(which), o);
}

/// After a run: the bad samples a set's loaders left out on this rank (on_bad_sample::skip), on
/// stderr whatever --quiet says.
template <class Set>
void report_skipped(const char* program, int rank, const char* what, const Set& set) {
  if constexpr (requires { set.skipped(); }) {
    if (const std::string s = set.skipped().summary(); !s.empty())
      std::cerr << program << ": rank " << rank << ": " << what << " set " << set.description() << ": " << s << "\n";
  }
}

}  // namespace example
