// SPDX-License-Identifier: Apache-2.0
#pragma once
// Labelled image sets over memory-mapped IDX files: a process touches only the pages of the
// samples it reads, so data-parallel ranks read their own samples where they lie instead of each
// loading the whole set. Gzip'd images are decompressed once into an on-disk cache. POSIX only.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/data/cache.hpp"
#include "loom/data/dataset.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/idx.hpp"

namespace loom::data {

namespace detail {

LOOM_DECL std::string errno_text(int err);

/// An owned POSIX file descriptor.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  /// Closes and reports close()'s error (0 if none): on NFS a failed write can surface here.
  int close() noexcept {
    const int fd = std::exchange(fd_, -1);
    return fd >= 0 && ::close(fd) != 0 ? (errno ? errno : EIO) : 0;
  }

 private:
  int fd_ = -1;
};

/// Reads a file from the start with pread, reporting failures as idx_input does.
class pread_input {
 public:
  pread_input(int fd, const std::filesystem::path& file) : fd_(fd), path_(&file) {}

  /// Reads up to n bytes into dst; fewer only at the end of the file.
  std::size_t read(std::uint8_t* dst, std::size_t n);

 private:
  int fd_;
  const std::filesystem::path* path_;
  std::uint64_t offset_ = 0;
};

/// The errors read_idx reports when `available` bytes follow the header instead of
/// header.data_bytes: too few ("file is truncated") or too many ("unexpected bytes").
LOOM_DECL void check_idx_data_size(const idx_header& h, std::uint64_t available,
                                   const std::filesystem::path& file,
                                   const std::string& decompressed);

/// A read-only shared mapping of a whole file, unmapped on destruction.
class mapped_region {
 public:
  mapped_region(int fd, std::size_t length, const std::filesystem::path& file);
  /// `length` bytes of anonymous memory (private, zero-filled, writable through writable()):
  /// where a gzip'd file is decompressed when no cache directory can be used. `file` names the
  /// source in messages.
  mapped_region(std::size_t length, const std::filesystem::path& file);
  mapped_region(const mapped_region&) = delete;
  mapped_region& operator=(const mapped_region&) = delete;
  ~mapped_region() { ::munmap(const_cast<std::uint8_t*>(base_), length_); }
  const std::uint8_t* data() const noexcept { return base_; }
  std::uint8_t* writable() noexcept { return const_cast<std::uint8_t*>(base_); }
  std::size_t size() const noexcept { return length_; }

 private:
  const std::uint8_t* base_ = nullptr;
  std::size_t length_;
};

/// An uncompressed IDX file, checked like read_idx (same messages) and mapped; the data is not
/// read. Also checks that the file is a regular file that can be mapped.
struct mapped_idx {
  std::shared_ptr<const mapped_region> region;
  idx_header header;
  const std::uint8_t* data = nullptr;
};

LOOM_DECL mapped_idx map_idx_file(const std::filesystem::path& file, std::size_t min_rank,
                                  std::size_t max_rank);

/// Whether a file starts with the gzip magic bytes 1f 8b (false when it cannot be read; the
/// reader then reports why).
LOOM_DECL bool starts_with_gzip_magic(const std::filesystem::path& file);

/// FNV-1a: a stable 64-bit hash of a path, to tell apart sources that share a file name.
LOOM_DECL std::uint64_t fnv1a64(const std::string& s) noexcept;

/// The name of the decompressed copy of `source` in a cache directory: the source's name
/// without ".gz", a hash of its absolute path, its size and its modification time in
/// nanoseconds, e.g. "t10k-images-idx3-ubyte.5c1e...-4422102-1690000000123456789".
LOOM_DECL std::string idx_cache_name(const std::filesystem::path& source);

/// Removes a temporary file unless released.
class temp_file_guard {
 public:
  explicit temp_file_guard(std::filesystem::path p) : path_(std::move(p)) {}
  temp_file_guard(const temp_file_guard&) = delete;
  temp_file_guard& operator=(const temp_file_guard&) = delete;
  ~temp_file_guard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  void release() noexcept { path_.clear(); }

 private:
  std::filesystem::path path_;
};

/// Writes all n bytes or throws an io_error naming `file` and what was being done.
LOOM_DECL void write_all(int fd, const std::uint8_t* p, std::size_t n,
                         const std::filesystem::path& file, const std::string& doing);

/// Whether `file` exists as a valid uncompressed IDX file of rank min_rank..max_rank whose size
/// matches its header. Throws only io_error for a file that exists but cannot be read.
LOOM_DECL bool valid_idx_file(const std::filesystem::path& file, std::size_t min_rank,
                              std::size_t max_rank);

/// The path of an uncompressed copy of the gzip'd IDX file `source` in `cache_dir` (default:
/// default_cache_dir()), made by decompressing it once; later calls (from any process) reuse it
/// while it matches its stamp. Nothing when the directory cannot be used (open_private_dir says
/// why; a warning is printed): the caller then decompresses into memory. See
/// mapped_images::from_idx for the protocol and the errors.
LOOM_DECL std::optional<std::filesystem::path> idx_cache_file(const std::filesystem::path& source,
                                                              const std::filesystem::path& cache_dir,
                                                              std::size_t min_rank, std::size_t max_rank);

/// The gzip'd IDX file `source` decompressed into anonymous memory, checked as read_idx checks
/// it (same messages).
LOOM_DECL mapped_idx inflate_idx_file(const std::filesystem::path& source, std::size_t min_rank,
                                      std::size_t max_rank);

}  // namespace detail

/// A labelled image set whose pixels stay in an uncompressed IDX file, mapped read-only into
/// memory (MAP_SHARED, MADV_RANDOM): reading sample i faults in only the pages that hold it, so
/// a data-parallel rank that reads its own share of each epoch never reads the whole set. The
/// labels (one byte per sample) are read into memory when the set is opened.
///
/// The same read interface as labelled_images (sample_shape, classes, size, pixels, label,
/// description, first), so batch_loader, distributed_loader and the trainer take either.
/// Move-only; the mapping is shared with the views that first() returns and is unmapped when the
/// set and all its views are gone. The file must not be truncated while it is mapped (reading a
/// page past the new end raises SIGBUS); the cache never truncates, it renames new files in.
///
/// Requires: SampleShape is a loom::shape; 1 <= Classes <= 256; a POSIX system.
template <class SampleShape, std::size_t Classes>
class mapped_images {
  static_assert(shape_type<SampleShape>, "mapped_images needs a loom::shape as sample shape");
  static_assert(Classes >= 1 && Classes <= 256, "mapped_images labels are bytes: 1..256 classes");

 public:
  using sample_shape = SampleShape;
  static constexpr std::size_t classes = Classes;

  /// Opens an IDX images file (unsigned bytes, count x extents..., the extents' product being
  /// SampleShape::size) and an IDX labels file (unsigned bytes, one dimension).
  ///
  /// The images are checked as read_idx checks them — magic number, header, and a file size of
  /// exactly header + promised data — but not read. The labels are read in full (raw or gzip)
  /// and checked to be < Classes. Every message is the one labelled_images::from_idx gives for
  /// the same files.
  ///
  /// Gzip'd images (detected by their magic bytes, not their name) cannot be read at random, so
  /// they are decompressed once into `cache_dir` (default: default_cache_dir()) and the copy is
  /// mapped. The cache directory is made private (mode 0700) and used only while it is a
  /// directory of this user that nobody else can write (detail::open_private_dir); otherwise
  /// loom prints a warning naming the directory and why, and decompresses into memory instead.
  /// Beside each copy a stamp (COPY.stamp) records the CRC-32C and size of the source and of the
  /// copy; a copy is used only when both still match (the source and the copy are read once
  /// more to check), so a planted, stale or damaged copy is re-created, never trusted.
  /// The copy's name is the source's name with a hash of the source's absolute path, its size
  /// and its modification time; old copies are not removed. The source is decompressed into a
  /// uniquely named temporary file (mode 0600) in cache_dir, checked as read_idx checks it,
  /// fsync'ed, its stamp written, and then published under the final name with link() (or
  /// rename() where the file system has no hard links), so no process ever sees a half-written
  /// copy under the final name and a good copy published by another process — on this host or
  /// another one sharing the directory — is never replaced. Concurrent first opens may each
  /// decompress; one copy wins. A process killed while decompressing leaves only its
  /// "NAME.tmp-PID-..." file, never used and safe to delete.
  /// On several machines, cache_dir may be shared storage (decompressed once for all) or local
  /// to each machine (decompressed once per machine); both are safe.
  ///
  /// `description` names the set in messages and description(); when empty it names both files.
  /// When the images were decompressed, ", mapped from COPY" (or ", decompressed into memory")
  /// is appended.
  ///
  /// Throws: loom::io_error when a file cannot be opened, read or mapped, when the cache
  /// directory cannot be written (disk full: the message names the file, the source and the
  /// reason); loom::data_error for a malformed file, a
  /// corrupt gzip stream, an image size that does not match SampleShape, counts that differ or
  /// a label >= Classes, naming the file concerned, what was expected and what was found.
  static mapped_images from_idx(const std::filesystem::path& images,
                                const std::filesystem::path& labels, std::string description = {},
                                const std::filesystem::path& cache_dir = {}) {
    std::filesystem::path mapped_file = images;
    bool in_memory = false;
    if (detail::starts_with_gzip_magic(images)) {
      const std::optional<std::filesystem::path> copy = detail::idx_cache_file(images, cache_dir, 2, 255);
      in_memory = !copy;
      if (copy) mapped_file = *copy;
    }
    detail::mapped_idx img =
        in_memory ? detail::inflate_idx_file(images, 2, 255) : detail::map_idx_file(mapped_file, 2, 255);
    std::size_t per_image = 1;
    std::string extents;
    for (std::size_t i = 1; i < img.header.dims.size(); ++i) {
      const std::size_t d = img.header.dims[i];
      per_image = (d != 0 && per_image > SIZE_MAX / d) ? SIZE_MAX : per_image * d;
      extents += (i > 1 ? " x " : "") + std::to_string(img.header.dims[i]);
    }
    if (per_image != SampleShape::size) {
      throw data_error("loom: images file " + images.string() + ": wrong image size: expected " +
                       std::to_string(SampleShape::size) + " bytes per image for sample shape " +
                       loom::to_string<SampleShape>() + ", found images of " + extents + " = " +
                       std::to_string(per_image) + " bytes");
    }
    idx_array lab = read_idx(labels, 1);
    if (img.header.dims[0] != lab.dims[0]) {
      throw data_error("loom: images file " + images.string() + " holds " +
                       std::to_string(img.header.dims[0]) + " images but labels file " +
                       labels.string() + " holds " + std::to_string(lab.dims[0]) +
                       " labels: expected equal counts");
    }
    const std::string where = "loom: labels file " + labels.string() + ": ";
    for (std::size_t i = 0; i < lab.data.size(); ++i) {
      if (lab.data[i] >= Classes) {
        throw data_error(where + "label " + std::to_string(lab.data[i]) + " at index " +
                         std::to_string(i) + " is out of range: expected 0.." +
                         std::to_string(Classes - 1));
      }
    }
    if (description.empty()) {
      description = "images " + images.string() + ", labels " + labels.string();
    }
    if (mapped_file != images) description += ", mapped from " + mapped_file.string();
    if (in_memory) description += ", decompressed into memory";
    mapped_images out;
    out.size_ = lab.data.size();
    out.pixels_ = img.data;
    out.region_ = std::move(img.region);
    out.labels_ = std::make_shared<const std::vector<std::uint8_t>>(std::move(lab.data));
    out.description_ = std::move(description);
    out.file_ = std::move(mapped_file);
    return out;
  }

  mapped_images(const mapped_images&) = delete;
  mapped_images& operator=(const mapped_images&) = delete;
  /// A moved-from set is empty.
  mapped_images(mapped_images&& o) noexcept { *this = std::move(o); }
  mapped_images& operator=(mapped_images&& o) noexcept {
    if (this != &o) {
      region_ = std::move(o.region_);
      labels_ = std::move(o.labels_);
      pixels_ = std::exchange(o.pixels_, nullptr);
      size_ = std::exchange(o.size_, 0);
      description_ = std::move(o.description_);
      file_ = std::move(o.file_);
    }
    return *this;
  }
  ~mapped_images() = default;

  /// The number of samples.
  std::size_t size() const noexcept { return size_; }

  /// The SampleShape::size bytes of sample i, row-major, inside the mapping (reading them may
  /// fault the page in from the file). Requires: i < size().
  const std::uint8_t* pixels(std::size_t i) const noexcept {
    return pixels_ + i * SampleShape::size;
  }

  /// The label of sample i, in 0..Classes-1. Requires: i < size().
  std::uint8_t label(std::size_t i) const noexcept { return (*labels_)[i]; }

  /// A view of samples 0..n-1 that shares this set's mapping and labels (nothing is copied or
  /// read); it stays valid after this set is destroyed.
  ///
  /// Throws: loom::invalid_argument when n > size().
  mapped_images first(std::size_t n) const {
    if (n > size()) {
      throw invalid_argument("loom: " + description_ + ": first(" + std::to_string(n) +
                             "): expected at most " + std::to_string(size()) +
                             " samples, the set holds " + std::to_string(size()));
    }
    mapped_images out;
    out.region_ = region_;
    out.labels_ = labels_;
    out.pixels_ = pixels_;
    out.size_ = n;
    out.description_ = description_ + " (first " + std::to_string(n) + ")";
    out.file_ = file_;
    return out;
  }

  /// What the set is and where it came from, for messages and logs.
  const std::string& description() const noexcept { return description_; }

  /// The uncompressed images file that is mapped: the images file given, or its decompressed
  /// copy in the cache directory (the images file given when it was decompressed into memory).
  const std::filesystem::path& file() const noexcept { return file_; }

 private:
  mapped_images() = default;

  std::shared_ptr<const detail::mapped_region> region_;
  std::shared_ptr<const std::vector<std::uint8_t>> labels_;
  const std::uint8_t* pixels_ = nullptr;
  std::size_t size_ = 0;
  std::string description_;
  std::filesystem::path file_;
};

/// Fashion-MNIST and MNIST, memory-mapped: 28 x 28 grey-scale images, 10 classes.
using mapped_fashion_mnist_set = mapped_images<shape<1, 28, 28>, 10>;

namespace detail {

/// DIR/NAME if it exists (it can be mapped as it is), else DIR/NAME.gz if it exists; otherwise
/// throws loom::io_error naming both paths tried and `hint`.
LOOM_DECL std::filesystem::path find_mappable_idx_file(const std::filesystem::path& dir,
                                                       const std::string& name,
                                                       const std::string& what,
                                                       const std::string& hint);

LOOM_DECL mapped_fashion_mnist_set map_mnist_layout(const std::filesystem::path& dir, split s,
                                                    const std::filesystem::path& cache_dir,
                                                    const std::string& set_name,
                                                    const std::string& hint);

}  // namespace detail

/// The train or test split of Fashion-MNIST from dir, memory-mapped (see mapped_images): the
/// uncompressed {train,t10k}-images-idx3-ubyte is mapped where it lies when dir has it;
/// otherwise the ".gz" one is decompressed once into cache_dir (default: default_cache_dir())
/// and the copy is mapped. Labels are read from either form.
///
/// Throws: loom::io_error when a file is missing (naming both names tried and how to install
/// the data), unreadable, or the cache cannot be written; loom::data_error when a file is
/// malformed (see mapped_images::from_idx).
LOOM_DECL mapped_fashion_mnist_set mapped_fashion_mnist(const std::filesystem::path& dir, split s,
                                                        const std::filesystem::path& cache_dir = {});

/// mapped_fashion_mnist(default_fashion_mnist_dir, s).
LOOM_DECL mapped_fashion_mnist_set mapped_fashion_mnist(split s);

/// MNIST (handwritten digits) from dir, memory-mapped; as mapped_fashion_mnist.
LOOM_DECL mapped_fashion_mnist_set mapped_mnist(const std::filesystem::path& dir, split s,
                                                const std::filesystem::path& cache_dir = {});

// The memory-mapped Fashion-MNIST set and the loader over it, which every data-parallel
// program over it uses: compiled once in loom::compiled (LOOM_INSTANTIATE, loom/core/config.hpp).
LOOM_INSTANTIATE(class mapped_images<shape<1, 28, 28>, 10>)
LOOM_INSTANTIATE(class distributed_loader<mapped_fashion_mnist_set>)
LOOM_INSTANTIATE(batch_share distributed_loader<mapped_fashion_mnist_set>::next<float>(float*, std::int32_t*))

}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/mapped.ipp"
#endif
