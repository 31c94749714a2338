// SPDX-License-Identifier: Apache-2.0
#pragma once
// The on-disk caches loom keeps (decompressed IDX images, scanned shard manifests): where they
// live, how their directory is made private, and the checksum stamp written beside every cached
// copy so that a copy is used only when it still matches its source. No cache is ever required:
// when its directory cannot be trusted, loom warns and works without it. POSIX only.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::data {

/// The directory of loom's caches, when no other is given: $LOOM_CACHE_DIR, else
/// $XDG_CACHE_HOME/loom, else $HOME/.cache/loom, else /tmp/loom-cache-UID (an empty variable
/// counts as unset). Nothing is created here; detail::open_private_dir makes and checks it.
LOOM_DECL std::filesystem::path default_cache_dir();

namespace detail {

/// Makes `dir` a private directory (mode 0700; missing parents with the default mode) unless
/// it exists, then checks it: a directory, not a symbolic link, owned by this process's
/// effective user, and not writable by its group or by others — so that nobody else can plant
/// or replace a file in it. Returns "" when it can be used, else a sentence saying why not
/// (naming the directory, the owner or mode found and what is expected).
LOOM_DECL std::string open_private_dir(const std::filesystem::path& dir);

/// The same checks for an existing file in such a directory: a regular file, not a link,
/// owned by this user, not writable by group or others. "" when it can be used.
LOOM_DECL std::string private_file_problem(const std::filesystem::path& file);

/// Prints "loom: warning: not using the cache directory DIR: WHY; WITHOUT" to stderr, once per
/// directory and process (it is not hidden by the examples' --quiet).
LOOM_DECL void warn_cache_refused(const std::filesystem::path& dir, const std::string& why,
                                  const std::string& without);

/// The CRC-32C and size of a file's bytes. Throws loom::io_error when it cannot be read.
struct file_checksum {
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  bool operator==(const file_checksum&) const = default;
};
LOOM_DECL file_checksum checksum_file(const std::filesystem::path& file);
LOOM_DECL file_checksum checksum_bytes(const void* data, std::size_t n) noexcept;

/// What the stamp beside a cached copy (COPY.stamp) records: a checksum of the source the copy
/// was made from and one of the copy's own bytes.
struct cache_stamp {
  file_checksum source;
  file_checksum copy;
};

/// COPY.stamp.
LOOM_DECL std::filesystem::path stamp_path(const std::filesystem::path& copy);

/// Writes the stamp of `copy` atomically (a temporary file renamed over COPY.stamp), mode 0600.
/// Throws loom::io_error when it cannot.
LOOM_DECL void write_stamp(const std::filesystem::path& copy, const cache_stamp& stamp);

/// Whether `copy` may be used as a copy of a source whose checksum is `source`: the copy and
/// its stamp are private files (private_file_problem), the stamp records `source`, and the
/// copy's bytes have the checksum the stamp records. Returns "" when it may, else why not.
LOOM_DECL std::string cached_copy_problem(const std::filesystem::path& copy, const file_checksum& source);

}  // namespace detail
}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/cache.ipp"
#endif
