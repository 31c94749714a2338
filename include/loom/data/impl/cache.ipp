// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of cache.hpp's functions: included at the end of the header (header-only), or
// compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "loom/core/crc32c.hpp"
#include "loom/data/cache.hpp"

namespace loom::data {

LOOM_DECL std::filesystem::path default_cache_dir() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  if (std::string d = env("LOOM_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return std::filesystem::path(d) / "loom";
  if (std::string d = env("HOME"); !d.empty()) return std::filesystem::path(d) / ".cache" / "loom";
  return std::filesystem::path("/tmp") / ("loom-cache-" + std::to_string(::getuid()));
}

namespace detail {

inline std::string cache_mode_text(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777u);
  return buf;
}

// What is wrong with a stat'ed path that should be this user's private directory or file.
inline std::string cache_ownership_problem(const std::filesystem::path& p, const struct ::stat& st, bool directory) {
  const char* what = directory ? "directory" : "file";
  if (S_ISLNK(st.st_mode))
    return "cache " + std::string(what) + " " + p.string() + " is a symbolic link: expected a real " + what;
  if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    return "cache " + std::string(what) + " " + p.string() + " is not a " + (directory ? "directory" : "regular file");
  if (st.st_uid != ::geteuid())
    return "cache " + std::string(what) + " " + p.string() + " is owned by uid " + std::to_string(st.st_uid) +
           ": expected uid " + std::to_string(::geteuid()) + ", this process's user (someone else could plant files in it)";
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return "cache " + std::string(what) + " " + p.string() + " has mode " + cache_mode_text(st.st_mode) +
           ": expected no write permission for group or others (0700 for a directory)";
  return {};
}

LOOM_DECL std::string open_private_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.has_parent_path() && !std::filesystem::exists(dir.parent_path(), ec))
    std::filesystem::create_directories(dir.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    const int err = errno;
    return "cannot create cache directory " + dir.string() + ": " + std::strerror(err);
  }
  struct ::stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    const int err = errno;
    return "cannot stat cache directory " + dir.string() + ": " + std::strerror(err);
  }
  return cache_ownership_problem(dir, st, true);
}

LOOM_DECL std::string private_file_problem(const std::filesystem::path& file) {
  struct ::stat st {};
  if (::lstat(file.c_str(), &st) != 0) {
    const int err = errno;
    return "cannot stat " + file.string() + ": " + std::strerror(err);
  }
  return cache_ownership_problem(file, st, false);
}

LOOM_DECL void warn_cache_refused(const std::filesystem::path& dir, const std::string& why,
                                  const std::string& without) {
  static std::mutex m;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(m);
  if (!warned.insert(dir.string()).second) return;
  std::fprintf(stderr, "loom: warning: not using the cache directory %s: %s; %s\n", dir.c_str(), why.c_str(),
               without.c_str());
  std::fflush(stderr);
}

LOOM_DECL file_checksum checksum_bytes(const void* data, std::size_t n) noexcept {
  return {n, crc32c(data, n)};
}

LOOM_DECL file_checksum checksum_file(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw io_error("loom: cannot open " + file.string() + " to checksum it: " + std::strerror(err));
  }
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<unsigned char> buf(std::size_t{1} << 20);
  file_checksum out;
  for (;;) {
    const ::ssize_t k = ::read(fd, buf.data(), buf.size());
    if (k < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw io_error("loom: cannot read " + file.string() + " to checksum it: " + std::strerror(err));
    }
    if (k == 0) break;
    out.crc = crc32c(buf.data(), static_cast<std::size_t>(k), out.crc);
    out.bytes += static_cast<std::uint64_t>(k);
  }
  ::close(fd);
  return out;
}

LOOM_DECL std::filesystem::path stamp_path(const std::filesystem::path& copy) {
  return std::filesystem::path(copy.string() + ".stamp");
}

inline std::string stamp_text(const cache_stamp& s) {
  return "loom-cache-stamp 1\nsource_bytes " + std::to_string(s.source.bytes) + "\nsource_crc32c " +
         crc32c_hex(s.source.crc).data() + "\ncopy_bytes " + std::to_string(s.copy.bytes) + "\ncopy_crc32c " +
         crc32c_hex(s.copy.crc).data() + "\n";
}

LOOM_DECL void write_stamp(const std::filesystem::path& copy, const cache_stamp& stamp) {
  const std::filesystem::path final_path = stamp_path(copy);
  const std::filesystem::path temp = final_path.string() + ".tmp-" + std::to_string(::getpid());
  const std::string text = stamp_text(stamp);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw io_error("loom: cannot write the cache stamp " + temp.string() + ": " + std::strerror(err));
  }
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<::ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(temp.c_str(), final_path.c_str()) != 0) {
    const int e = ok ? errno : err;
    (void)::unlink(temp.c_str());
    throw io_error("loom: cannot write the cache stamp " + final_path.string() + ": " + std::strerror(e));
  }
}

LOOM_DECL std::string cached_copy_problem(const std::filesystem::path& copy, const file_checksum& source) {
  const std::filesystem::path sp = stamp_path(copy);
  if (std::string p = private_file_problem(copy); !p.empty()) return p;
  if (std::string p = private_file_problem(sp); !p.empty()) return p;
  std::string text;
  if (std::FILE* f = std::fopen(sp.c_str(), "rb")) {
    char buf[512];
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    std::fclose(f);
    text.assign(buf, n);
  }
  file_checksum src, cp;
  unsigned long long sb = 0, cb = 0;
  unsigned sc = 0, cc = 0;
  if (std::sscanf(text.c_str(), "loom-cache-stamp 1\nsource_bytes %llu\nsource_crc32c %8x\ncopy_bytes %llu\ncopy_crc32c %8x",
                  &sb, &sc, &cb, &cc) != 4)
    return "cache stamp " + sp.string() + " is malformed: expected loom-cache-stamp 1 and four checksum fields";
  src = {sb, sc};
  cp = {cb, cc};
  if (src != source)
    return "cache stamp " + sp.string() + " records a source of " + std::to_string(src.bytes) + " bytes with CRC-32C " +
           crc32c_hex(src.crc).data() + ", the source now has " + std::to_string(source.bytes) + " bytes with CRC-32C " +
           crc32c_hex(source.crc).data();
  const file_checksum now = checksum_file(copy);
  if (now != cp)
    return "cached copy " + copy.string() + " has " + std::to_string(now.bytes) + " bytes with CRC-32C " +
           crc32c_hex(now.crc).data() + ", its stamp says " + std::to_string(cp.bytes) + " bytes with CRC-32C " +
           crc32c_hex(cp.crc).data();
  return {};
}

}  // namespace detail
}  // namespace loom::data
