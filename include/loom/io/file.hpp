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

#include "loom/core/error.hpp"

namespace loom::io {

namespace detail {
inline std::string errno_text(int e) { return std::strerror(e); }

/// "cannot write F: the directory D does not exist" and kin, from the errno of the failure.
inline std::string write_failure(const std::filesystem::path& target, const char* doing, int e) {
  const auto dir = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  std::string why;
  std::error_code ec;
  if (e == ENOENT && !std::filesystem::exists(dir, ec)) why = "the directory " + dir.string() + " does not exist";
  else if (e == ENOENT) why = "the directory " + dir.string() + " is not writable (" + errno_text(e) + ")";  // /proc, /sys
  else if (e == ENOTDIR) why = dir.string() + " is not a directory";
  else if (e == EACCES || e == EPERM || e == EROFS) why = "the directory " + dir.string() + " is not writable (" + errno_text(e) + ")";
  else if (e == ENOSPC || e == EDQUOT) why = "the disk is full (" + errno_text(e) + ")";
  else if (e == EFBIG) why = "the file would exceed the size limit (" + errno_text(e) + ")";
  else why = errno_text(e);
  return "cannot write " + target.string() + " (" + doing + "): " + why + "; nothing was written in its place";
}
}  // namespace detail

/// A file that appears at its path complete, or not at all.
/// Throws (every member): loom::io_error naming the target and what went wrong; the temporary
/// file is then removed and an existing file at the target is left as it was.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path target) : target_(std::move(target)) {
    const auto dir = directory();
    std::string name = ".";
    name += target_.filename().string();
    name += ".tmp-XXXXXX";  // mkstemp's pattern
    temp_ = (dir / name).string();
    fd_ = ::mkstemp(temp_.data());
    if (fd_ < 0) {
      const int e = errno;
      temp_.clear();
      throw io_error(detail::write_failure(target_, "creating a temporary file beside it", e));
    }
    ::fchmod(fd_, 0644);
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() { discard(); }

  /// Appends n bytes.
  void write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n > (1u << 30) ? (1u << 30) : n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("writing", w < 0 ? errno : ENOSPC);
      p += w, n -= static_cast<std::size_t>(w), written_ += static_cast<std::uint64_t>(w);
    }
  }
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// Bytes written so far.
  std::uint64_t size() const noexcept { return written_; }

  /// Makes the file durable and puts it at the target path.
  void commit() {
    if (::fsync(fd_) != 0) fail("flushing it to disk", errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("closing it", errno);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("renaming the temporary file into place", errno);
    temp_.clear();
    // The rename is durable once the directory is.
    const int dfd = ::open(directory().c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      const int r = ::fsync(dfd);
      const int e = errno;
      ::close(dfd);
      if (r != 0 && e != EINVAL) throw io_error(detail::write_failure(target_, "flushing its directory", e));
    }
  }

 private:
  std::filesystem::path directory() const {
    return target_.parent_path().empty() ? std::filesystem::path(".") : target_.parent_path();
  }
  [[noreturn]] void fail(const char* doing, int e) {
    discard();
    throw io_error(detail::write_failure(target_, doing, e));
  }
  void discard() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    if (!temp_.empty()) ::unlink(temp_.c_str()), temp_.clear();
  }

  std::filesystem::path target_;
  std::string temp_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

/// A file opened for reading, with its size; reads name the file when they fail.
class input_file {
 public:
  /// Throws: loom::io_error when the file is missing or cannot be opened.
  explicit input_file(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      const int e = errno;
      throw io_error("cannot read " + path_.string() + ": " +
                     (e == ENOENT ? std::string("no such file") : detail::errno_text(e)));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw io_error("cannot read " + path_.string() + ": not a regular file");
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  ~input_file() { ::close(fd_); }

  std::uint64_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Reads n bytes at offset into dst. Throws: loom::io_error when the file ends first.
  void read_at(std::uint64_t offset, void* dst, std::size_t n, const std::string& what) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n > (1u << 30) ? (1u << 30) : n, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw io_error("cannot read " + path_.string() + " (" + what + "): " + detail::errno_text(errno));
      if (r == 0)
        throw io_error(path_.string() + " is truncated: " + what + " ends past the end of the file (" +
                       std::to_string(size_) + " bytes)");
      p += r, n -= static_cast<std::size_t>(r), offset += static_cast<std::uint64_t>(r);
    }
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace loom::io
