// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of file.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/io/file.hpp"

namespace loom::io {
namespace detail {

LOOM_DECL std::string errno_text(int e) { return std::strerror(e); }

LOOM_DECL std::string write_failure(const std::filesystem::path& target, const char* doing, int e) {
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
}  // namespace loom::io

namespace loom::io {

LOOM_DECL atomic_file::atomic_file(std::filesystem::path target) : target_(std::move(target)) {
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

LOOM_DECL void atomic_file::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing", w < 0 ? errno : ENOSPC);
    p += w, n -= static_cast<std::size_t>(w), written_ += static_cast<std::uint64_t>(w);
  }
}

LOOM_DECL void atomic_file::commit() {
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

LOOM_DECL std::filesystem::path atomic_file::directory() const {
  return target_.parent_path().empty() ? std::filesystem::path(".") : target_.parent_path();
}

LOOM_DECL void atomic_file::fail(const char* doing, int e) {
  discard();
  throw io_error(detail::write_failure(target_, doing, e));
}

LOOM_DECL void atomic_file::discard() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!temp_.empty()) ::unlink(temp_.c_str()), temp_.clear();
}

LOOM_DECL input_file::input_file(std::filesystem::path path) : path_(std::move(path)) {
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

LOOM_DECL void input_file::read_at(std::uint64_t offset, void* dst, std::size_t n, const std::string& what) const {
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
}  // namespace loom::io
