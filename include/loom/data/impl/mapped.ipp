// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of mapped.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <random>  // std::random_device, for a unique temporary name

#include "loom/core/crc32c.hpp"

#include "loom/data/mapped.hpp"

namespace loom::data {
namespace detail {

LOOM_DECL std::string errno_text(int err) { return err ? std::strerror(err) : "unknown error"; }

LOOM_DECL std::size_t pread_input::read(std::uint8_t* dst, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ::ssize_t k = ::pread(fd_, dst + got, n - got, static_cast<::off_t>(offset_));
    if (k < 0) {
      if (errno == EINTR) continue;
      throw io_error(idx_prefix(*path_) + "read failed: " + errno_text(errno));
    }
    if (k == 0) break;
    got += static_cast<std::size_t>(k);
    offset_ += static_cast<std::uint64_t>(k);
  }
  return got;
}

LOOM_DECL void check_idx_data_size(const idx_header& h, std::uint64_t available,
                                   const std::filesystem::path& file,
                                   const std::string& decompressed) {
  if (available < h.data_bytes) {
    throw data_error(idx_prefix(file) + "file is truncated: header promises " + h.promise +
                     " of data, found " + std::to_string(available) + decompressed);
  }
  if (available > h.data_bytes) {
    throw data_error(idx_prefix(file) + std::to_string(available - h.data_bytes) +
                     " unexpected bytes after the data" + decompressed + ": expected exactly " +
                     h.promise + " after the " + std::to_string(h.bytes.size()) + "-byte header");
  }
}

LOOM_DECL mapped_region::mapped_region(int fd, std::size_t length, const std::filesystem::path& file) : length_(length) {
  void* p = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw io_error(idx_prefix(file) + "cannot map " + std::to_string(length) +
                   " bytes into memory: " + errno_text(errno));
  }
  base_ = static_cast<const std::uint8_t*>(p);
  // Samples are read in shuffled order: read-ahead would fetch other ranks' samples.
  (void)::madvise(p, length, MADV_RANDOM);
}

LOOM_DECL mapped_region::mapped_region(std::size_t length, const std::filesystem::path& file) : length_(length) {
  void* p = ::mmap(nullptr, std::max<std::size_t>(length, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw io_error(idx_prefix(file) + "cannot allocate " + std::to_string(length) +
                   " bytes of memory to decompress it into: " + errno_text(errno));
  }
  length_ = std::max<std::size_t>(length, 1);
  base_ = static_cast<const std::uint8_t*>(p);
}

LOOM_DECL mapped_idx map_idx_file(const std::filesystem::path& file, std::size_t min_rank,
                                  std::size_t max_rank) {
  unique_fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw io_error(idx_prefix(file) + "cannot open: " + errno_text(errno));
  // Reading the header must not read ahead into the samples (other ranks' samples).
  (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM);
  pread_input in(fd.get(), file);
  mapped_idx out;
  out.header = read_idx_header(in, file, min_rank, max_rank, "");
  struct ::stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw io_error(idx_prefix(file) + "cannot stat: " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw io_error(idx_prefix(file) + "not a regular file: expected a file that can be mapped");
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  check_idx_data_size(out.header, file_size - out.header.bytes.size(), file, "");
  out.region = std::make_shared<const mapped_region>(fd.get(), file_size, file);
  out.data = out.region->data() + out.header.bytes.size();
  return out;
}

LOOM_DECL bool starts_with_gzip_magic(const std::filesystem::path& file) {
  unique_fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM);
  std::array<std::uint8_t, 2> m{};
  const ::ssize_t k = ::pread(fd.get(), m.data(), m.size(), 0);
  return k == 2 && m[0] == 0x1F && m[1] == 0x8B;
}

LOOM_DECL std::uint64_t fnv1a64(const std::string& s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

LOOM_DECL std::string idx_cache_name(const std::filesystem::path& source) {
  struct ::stat st {};
  if (::stat(source.c_str(), &st) != 0) {
    throw io_error(idx_prefix(source) + "cannot stat: " + errno_text(errno));
  }
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::canonical(source, ec);
  if (ec) abs = std::filesystem::absolute(source, ec);
  std::string stem = source.filename().string();
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".gz") == 0) stem.resize(stem.size() - 3);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(fnv1a64(abs.string())));
  const auto mtime_ns = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL +
                        static_cast<long long>(st.st_mtim.tv_nsec);
  return stem + "." + hash + "-" + std::to_string(static_cast<long long>(st.st_size)) + "-" +
         std::to_string(mtime_ns);
}

LOOM_DECL void write_all(int fd, const std::uint8_t* p, std::size_t n,
                         const std::filesystem::path& file, const std::string& doing) {
  while (n > 0) {
    const ::ssize_t k = ::write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw io_error(idx_prefix(file) + "write failed " + doing + ": " + errno_text(errno));
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

LOOM_DECL bool valid_idx_file(const std::filesystem::path& file, std::size_t min_rank,
                              std::size_t max_rank) {
  struct ::stat st {};
  if (::stat(file.c_str(), &st) != 0) return false;
  try {
    (void)map_idx_file(file, min_rank, max_rank);
    return true;
  } catch (const data_error&) {
    return false;
  }
}

// Decompresses the gzip'd IDX file `source`, checking it as read_idx does, into `sink(bytes,
// n)` calls: the header first, then the data. Returns the header.
template <class Sink>
idx_header inflate_idx_into(const std::filesystem::path& source, std::size_t min_rank, std::size_t max_rank,
                            Sink&& sink) {
  idx_input in(source);
  const std::string decompressed = in.gzip() ? " after decompression" : "";
  idx_header h = read_idx_header(in, source, min_rank, max_rank, decompressed);
  sink(h.bytes.data(), h.bytes.size());
  std::vector<std::uint8_t> buf(std::size_t{1} << 20);
  std::size_t got = 0;
  while (got < h.data_bytes) {
    const std::size_t want = std::min(buf.size(), h.data_bytes - got);
    const std::size_t k = in.read(buf.data(), want);
    sink(buf.data(), k);
    got += k;
    if (k < want) break;
  }
  // Reading to the end also lets zlib verify the gzip checksum.
  const std::uint64_t extra = got < h.data_bytes ? 0 : in.drain();
  check_idx_data_size(h, got + extra, source, decompressed);
  return h;
}

LOOM_DECL mapped_idx inflate_idx_file(const std::filesystem::path& source, std::size_t min_rank,
                                      std::size_t max_rank) {
  // The header tells the size; read it once to allocate, then decompress for real.
  std::size_t total = 0;
  {
    idx_input in(source);
    const std::string decompressed = in.gzip() ? " after decompression" : "";
    const idx_header h = read_idx_header(in, source, min_rank, max_rank, decompressed);
    total = h.bytes.size() + h.data_bytes;
  }
  auto region = std::make_shared<mapped_region>(total, source);
  std::size_t at = 0;
  mapped_idx out;
  out.header = inflate_idx_into(source, min_rank, max_rank, [&](const std::uint8_t* p, std::size_t n) {
    n = std::min(n, total - at);  // the check after the data reports any excess
    std::memcpy(region->writable() + at, p, n);
    at += n;
  });
  out.data = region->data() + out.header.bytes.size();
  out.region = std::move(region);
  return out;
}

LOOM_DECL std::optional<std::filesystem::path> idx_cache_file(const std::filesystem::path& source,
                                                              const std::filesystem::path& cache_dir,
                                                              std::size_t min_rank, std::size_t max_rank) {
  const std::filesystem::path dir = cache_dir.empty() ? default_cache_dir() : cache_dir;
  const std::string hint = "; pass another cache directory or set LOOM_CACHE_DIR";
  if (std::string why = open_private_dir(dir); !why.empty()) {
    warn_cache_refused(dir, why, "decompressing " + source.string() + " into memory instead" + hint);
    return std::nullopt;
  }
  const std::filesystem::path final_path = dir / idx_cache_name(source);
  const file_checksum source_sum = checksum_file(source);
  if (cached_copy_problem(final_path, source_sum).empty() && valid_idx_file(final_path, min_rank, max_rank))
    return final_path;

  // Decompress into a fresh file of our own in the same directory (so that link and rename are
  // atomic), checking it on the way exactly as read_idx checks a gzip'd file.
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  std::filesystem::path temp;
  unique_fd out;
  for (int attempt = 0; attempt < 100 && !out; ++attempt) {
    temp = dir / (final_path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                  std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rd()));
    out = unique_fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out && errno != EEXIST) {
      throw io_error("loom: cannot create a file in cache directory " + dir.string() +
                     " to decompress " + source.string() + " into: " + errno_text(errno) + hint);
    }
  }
  if (!out) {
    throw io_error("loom: cannot create a file in cache directory " + dir.string() +
                   " to decompress " + source.string() + " into: every name tried exists");
  }
  temp_file_guard guard(temp);
  const std::string doing = "while decompressing " + source.string() + " into the cache";
  file_checksum copy_sum;
  (void)inflate_idx_into(source, min_rank, max_rank, [&](const std::uint8_t* p, std::size_t n) {
    write_all(out.get(), p, n, temp, doing);
    copy_sum.crc = crc32c(p, n, copy_sum.crc);
    copy_sum.bytes += n;
  });
  if (::fsync(out.get()) != 0) {
    throw io_error(idx_prefix(temp) + "fsync failed " + doing + ": " + errno_text(errno));
  }
  if (const int err = out.close()) {
    throw io_error(idx_prefix(temp) + "close failed " + doing + ": " + errno_text(err));
  }
  // The stamp first: a copy without its stamp is never used (it is re-created).
  write_stamp(final_path, {source_sum, copy_sum});

  // Publish. link() never replaces: when another process got there first, its copy is kept
  // (and may already be mapped elsewhere). Only a copy that fails its stamp is replaced.
  bool replace = false;
  if (::link(temp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST) {
      replace = !cached_copy_problem(final_path, source_sum).empty() || !valid_idx_file(final_path, min_rank, max_rank);
    } else if (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS ||
               err == EMLINK) {
      replace = true;  // a file system without hard links: rename is still atomic
    } else {
      throw io_error("loom: cannot publish " + temp.string() + " as " + final_path.string() + ": " +
                     errno_text(err));
    }
  }
  if (replace && ::rename(temp.c_str(), final_path.c_str()) != 0) {
    throw io_error("loom: cannot rename " + temp.string() + " to " + final_path.string() + ": " +
                   errno_text(errno));
  }
  if (!replace) (void)::unlink(temp.c_str());
  guard.release();
  // Make the new directory entry durable too (best effort: not every file system can).
  if (unique_fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) {
    (void)::fsync(d.get());
  }
  return final_path;
}

LOOM_DECL std::filesystem::path find_mappable_idx_file(const std::filesystem::path& dir,
                                                       const std::string& name,
                                                       const std::string& what,
                                                       const std::string& hint) {
  const std::filesystem::path raw = dir / name;
  const std::filesystem::path gz = dir / (name + ".gz");
  std::error_code ec;
  if (std::filesystem::exists(raw, ec)) return raw;
  if (std::filesystem::exists(gz, ec)) return gz;
  throw io_error("loom: " + what + " not found: tried " + raw.string() + " and " + gz.string() +
                 "; " + hint);
}

LOOM_DECL mapped_fashion_mnist_set map_mnist_layout(const std::filesystem::path& dir, split s,
                                                    const std::filesystem::path& cache_dir,
                                                    const std::string& set_name,
                                                    const std::string& hint) {
  const std::string prefix = s == split::train ? "train" : "t10k";
  const std::string what = set_name + " " + to_string(s);
  const std::filesystem::path images =
      find_mappable_idx_file(dir, prefix + "-images-idx3-ubyte", what + " images", hint);
  const std::filesystem::path labels =
      find_idx_file(dir, prefix + "-labels-idx1-ubyte", what + " labels", hint);
  return mapped_fashion_mnist_set::from_idx(
      images, labels, what + " split (" + images.string() + ", " + labels.string() + ")",
      cache_dir);
}
}  // namespace detail
}  // namespace loom::data

namespace loom::data {

LOOM_DECL mapped_fashion_mnist_set mapped_fashion_mnist(const std::filesystem::path& dir, split s,
                                                        const std::filesystem::path& cache_dir) {
  return detail::map_mnist_layout(
      dir, s, cache_dir, "Fashion-MNIST",
      "install the data set with `apt-get install dataset-fashion-mnist`, or point to a "
      "directory holding it with --data DIR");
}

LOOM_DECL mapped_fashion_mnist_set mapped_fashion_mnist(split s) {
  return mapped_fashion_mnist(default_fashion_mnist_dir, s);
}

LOOM_DECL mapped_fashion_mnist_set mapped_mnist(const std::filesystem::path& dir, split s,
                                                const std::filesystem::path& cache_dir) {
  return detail::map_mnist_layout(
      dir, s, cache_dir, "MNIST",
      "point to a directory holding the MNIST IDX files with --data DIR");
}
}  // namespace loom::data
