// SPDX-License-Identifier: Apache-2.0
#pragma once
// Files written whole or not at all, and files read with messages that name them. An
// atomic_file writes a temporary file beside the target, and commit() fsyncs it, renames it
// over the target and fsyncs the directory: a reader sees the old file or the new one, never
// a part, and a failed write leaves the old file as it was. POSIX only.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::io {

namespace detail {
LOOM_DECL std::string errno_text(int e);

/// "cannot write F: the directory D does not exist" and kin, from the errno of the failure.
LOOM_DECL std::string write_failure(const std::filesystem::path& target, const char* doing, int e);
}  // namespace detail

/// A file that appears at its path complete, or not at all.
/// Throws (every member): loom::io_error naming the target and what went wrong; the temporary
/// file is then removed and an existing file at the target is left as it was.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target);
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() { discard(); }

  /// Appends n bytes.
  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// Bytes written so far.
  std::uint64_t size() const noexcept { return written_; }

  /// Makes the file durable and puts it at the target path.
  void commit();

 private:
  std::filesystem::path directory() const;
  [[noreturn]] void fail(const char* doing, int e);
  void discard() noexcept;

  std::filesystem::path target_;
  std::string temp_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

/// A file opened for reading, with its size; reads name the file when they fail.
class input_file {
 public:
  /// Throws: loom::io_error when the file is missing or cannot be opened.
  explicit input_file(std::filesystem::path path);
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  ~input_file() { ::close(fd_); }

  std::uint64_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Reads n bytes at offset into dst. Throws: loom::io_error when the file ends first.
  void read_at(std::uint64_t offset, void* dst, std::size_t n, const std::string& what) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace loom::io

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/file.ipp"
#endif
