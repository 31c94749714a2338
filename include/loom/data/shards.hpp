// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sets of WebDataset tar shards: where they are (a directory, a brace pattern, a list file), and
// their manifest — every shard's size and sample count, read from <prefix>.shards.json beside
// the shards or, for shards made elsewhere, scanned once and cached. The format is loom's; its
// reader and writer are both here (docs/data.md, "The manifest").

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::data {

/// What to do with a sample that cannot be used (no label, a label out of range, an image that
/// does not decode, a damaged or unreadable part of a shard): `fail` throws a loom::data_error
/// (or loom::io_error) naming the shard, the member and the byte offset; `skip` leaves the
/// sample out, counts it by reason and goes on.
enum class on_bad_sample { fail, skip };

/// One shard: its path, its size in bytes and how many samples it holds.
struct shard_info {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::uint64_t samples = 0;
};

/// What loom knows of a set of shards without reading them.
///
/// `classes` is the number of classes the labels index (0: unknown); `shards` in the set's
/// order, which defines every sample's index: shard i's j-th sample has index
/// samples(0) + ... + samples(i - 1) + j.
struct shard_manifest {
  std::size_t classes = 0;
  std::vector<shard_info> shards;

  /// The number of samples in all shards.
  std::uint64_t samples() const noexcept;

  /// A 64-bit FNV-1a hash, as 16 hex digits, of every shard's file name (not its directory),
  /// size and sample count, in order: the identity of the data a checkpoint records.
  std::string fingerprint() const;
};

/// The version of the manifest format this loom writes and reads ("loom_shards": 1).
inline constexpr int manifest_format_version = 1;

/// A manifest as JSON: {"loom_shards": 1, "classes": C, "samples": N, "shards": [{"file":
/// NAME, "bytes": B, "samples": S}, ...]}, one shard per line. A shard inside `dir` is named
/// relative to it, any other by its absolute path.
LOOM_DECL std::string manifest_json(const shard_manifest& m, const std::filesystem::path& dir);

/// Parses a manifest; relative file names are taken relative to `dir`; `file` names the
/// manifest in messages. Throws loom::data_error for malformed JSON, a missing or mistyped
/// field, another format version, or a "samples" total that is not the sum of the shards'.
LOOM_DECL shard_manifest parse_manifest(std::string_view text, const std::filesystem::path& dir,
                                        const std::filesystem::path& file);

/// Reads `file` (parse_manifest relative to its directory). Throws loom::io_error when it
/// cannot be read, and what parse_manifest throws.
LOOM_DECL shard_manifest read_manifest(const std::filesystem::path& file);

/// Writes `m` to `file` atomically: a temporary file in the same directory, fsync'ed and
/// renamed over `file`. Throws loom::io_error when it cannot.
LOOM_DECL void write_manifest(const std::filesystem::path& file, const shard_manifest& m);

/// Expands webdataset's (braceexpand's) brace patterns: "a-{000..002}.tar" gives a-000.tar,
/// a-001.tar, a-002.tar (zero-padded to the width of the wider bound when either bound has a
/// leading zero), "{a,b}.tar" gives a.tar and b.tar; several braces multiply, and a pattern
/// without braces is itself. Throws loom::invalid_argument for an unbalanced brace or a range
/// of more than 10^7 names.
LOOM_DECL std::vector<std::string> expand_braces(std::string_view pattern);

/// The shards a source names, in order:
/// - a directory: its `SPLIT-*.tar` files (all `*.tar` files when split is empty), sorted by
///   name;
/// - a pattern with braces: its expansion (expand_braces);
/// - a file whose name ends in ".tar": that one shard;
/// - any other file: a list file, one shard path per line (relative to the list's directory;
///   blank lines and lines starting with '#' are skipped).
/// Throws loom::io_error when the source does not exist, names no shard, or (a pattern) when
/// an expanded shard does not exist, naming it.
LOOM_DECL std::vector<std::filesystem::path> resolve_shards(const std::string& source, const std::string& split = {});

/// Where the manifest of these shards lies: PREFIX.shards.json in the first shard's
/// directory, PREFIX being the first shard's file name up to its last '-' or '_' (train-000000.tar:
/// "train"), or without ".tar" when it has neither; empty when the shards do not all share that
/// directory and prefix.
LOOM_DECL std::filesystem::path manifest_path_for(const std::vector<std::filesystem::path>& shards);

/// What scanning one shard found: its sample count (groups of members sharing a key, as the
/// reader sees them), the largest class index in it (-1: none) and its size; `problem` is empty,
/// or says why the scan stopped early (a damaged archive: the count is of the samples before).
struct shard_scan {
  std::uint64_t samples = 0;
  std::int64_t max_label = -1;
  std::uint64_t bytes = 0;
  std::string problem;
};

/// Reads one shard from start to end and counts its samples. Labels are read (they are a few
/// bytes), images are not decoded. Throws only loom::io_error, when the file cannot be opened.
LOOM_DECL shard_scan scan_shard(const std::filesystem::path& shard);

/// How load_manifest finds a manifest.
struct manifest_options {
  /// Where scanned manifests are cached (default: default_cache_dir()).
  std::filesystem::path cache_dir;
  /// Whether a scanned manifest may be cached and a cached one used.
  bool use_cache = true;
  /// What to do with a shard that is damaged, empty, or unreadable while scanning (fail: throw
  /// its message; skip: warn on stderr and count the samples before the damage).
  on_bad_sample on_bad = on_bad_sample::fail;
  /// Threads that scan shards at once (0: min(8, shards)).
  std::size_t scan_threads = 0;
};

/// The manifest of `shards` (in that order), from the first of:
/// 1. the manifest beside them (manifest_path_for) when it exists: every shard must be listed
///    in it (by file name, a subset of its shards is fine) and have the size it records;
/// 2. loom's cache: a manifest this user's processes scanned before, keyed by the shards'
///    absolute paths, sizes and modification times and checked against its stamp
///    (loom/data/cache.hpp);
/// 3. a scan of every shard (scan_shard; every shard is read once, start to end), then cached
///    for the next run. One process per cache directory scans at a time (an flock on
///    KEY.lock); the others wait and take its result. A scanned manifest's `classes` is 0
///    (unknown: the data set's type bounds the labels as they are read).
/// Every shard is stat'ed; none is opened unless it is scanned.
///
/// Throws: loom::io_error for a missing or unreadable shard or manifest; loom::data_error for a
/// malformed manifest, a shard the manifest does not list, a shard whose size differs from the
/// manifest's (naming both), or (under on_bad_sample::fail) a damaged or empty shard found by
/// the scan.
LOOM_DECL shard_manifest load_manifest(const std::vector<std::filesystem::path>& shards,
                                       const manifest_options& options = {});

}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/shards.ipp"
#endif
