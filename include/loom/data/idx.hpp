// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reader for IDX files, the format of MNIST and Fashion-MNIST, uncompressed or gzip-compressed.
// Only unsigned-byte arrays are read; every malformed input is reported as a loom::data_error
// that names the file, what was expected and what was found. Needs zlib (link ZLIB::ZLIB).

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::data {

/// The contents of one IDX file of unsigned bytes.
///
/// `dims` holds the extents as the header states them, outermost first (for MNIST images:
/// count, rows, columns); `data` holds the product of `dims` bytes in row-major order.
struct idx_array {
  std::filesystem::path path;
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;
};

namespace detail {

inline constexpr std::uint8_t idx_ubyte_type = 0x08;

/// "loom: FILE: " — the start of every message about one file.
LOOM_DECL std::string idx_prefix(const std::filesystem::path& file);

LOOM_DECL std::string idx_hex(std::uint32_t v);

LOOM_DECL std::string idx_dimensions(std::size_t rank);

/// What a magic number means, " (unsigned bytes, 3 dimensions)", or "" when it is no IDX magic.
LOOM_DECL std::string idx_describe_magic(std::uint32_t magic);

/// The magic numbers accepted for ranks min_rank..max_rank, in words.
LOOM_DECL std::string idx_expected_magic(std::size_t min_rank, std::size_t max_rank);

/// "60000 x 28 x 28 = 47040000 bytes"; "10 bytes" for one dimension; no " = ..." if total is "".
LOOM_DECL std::string idx_promise(const std::vector<std::uint32_t>& dims, const std::string& total);

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

/// A byte stream over one file that inflates it transparently when it starts with the gzip
/// magic bytes 1f 8b. Concatenated gzip members are read as one stream, as gzip does.
class idx_input {
 public:
  explicit idx_input(const std::filesystem::path& file);
  idx_input(const idx_input&) = delete;
  idx_input& operator=(const idx_input&) = delete;
  ~idx_input();

  bool gzip() const noexcept { return gzip_; }

  /// Reads up to n bytes into dst; fewer only at the end of the (decompressed) data.
  std::size_t read(std::uint8_t* dst, std::size_t n) {
    return gzip_ ? read_inflated(dst, n) : read_raw(dst, n);
  }

  /// Reads and discards everything left; returns how many bytes that was.
  std::uint64_t drain();

 private:
  static std::string zlib_text(int rc);

  std::size_t read_file(std::uint8_t* dst, std::size_t n);

  std::size_t read_raw(std::uint8_t* dst, std::size_t n);

  std::size_t read_inflated(std::uint8_t* dst, std::size_t n);

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, file_closer> file_;
  std::array<std::uint8_t, 2> peek_{};
  std::size_t peek_len_ = 0;
  std::size_t peek_pos_ = 0;
  bool gzip_ = false;
  std::unique_ptr<z_stream> zs_;
  std::vector<std::uint8_t> in_;
  bool member_ended_ = false;
  bool finished_ = false;
};

/// What an IDX header states: the extents and where the data starts and ends.
struct idx_header {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> bytes;  // the header as read: magic number and extents
  std::size_t data_bytes = 0;       // the product of dims
  std::string promise;              // "60000 x 28 x 28 = 47040000 bytes", for messages
};

/// Reads and checks an IDX header from `in` without reading the data; messages name `file`,
/// with `decompressed` after byte counts. read_idx and mapped_images both parse headers with
/// it, so they accept and reject the same files with the same words.
template <class Input>
idx_header read_idx_header(Input& in, const std::filesystem::path& file, std::size_t min_rank,
                           std::size_t max_rank, const std::string& decompressed) {
  const std::string where = idx_prefix(file);
  const std::string expected_magic = idx_expected_magic(min_rank, max_rank);
  std::array<std::uint8_t, 4> head{};
  const std::size_t head_got = in.read(head.data(), head.size());
  if (head_got == 0) {
    throw data_error(where + "file is empty: expected an IDX file starting with the magic number " +
                     expected_magic + ", found 0 bytes" + decompressed);
  }
  if (head_got < head.size()) {
    throw data_error(where + "file is truncated: expected a 4-byte magic number " + expected_magic +
                     ", found " + std::to_string(head_got) + " bytes" + decompressed);
  }
  const std::uint32_t magic = (std::uint32_t{head[0]} << 24) | (std::uint32_t{head[1]} << 16) |
                              (std::uint32_t{head[2]} << 8) | std::uint32_t{head[3]};
  const std::size_t rank = head[3];
  if (head[0] != 0 || head[1] != 0 || head[2] != idx_ubyte_type || rank < min_rank ||
      rank > max_rank) {
    throw data_error(where + "wrong magic number: expected " + expected_magic + ", found " +
                     idx_hex(magic) + idx_describe_magic(magic));
  }
  idx_header out;
  out.bytes.assign(head.begin(), head.end());
  out.bytes.resize(4 + 4 * rank);
  out.dims.resize(rank);
  const std::size_t dims_got = in.read(out.bytes.data() + 4, 4 * rank);
  if (dims_got < 4 * rank) {
    throw data_error(where + "file is truncated: expected a " + std::to_string(4 + 4 * rank) +
                     "-byte header (magic number and " + idx_dimensions(rank) + "), found " +
                     std::to_string(4 + dims_got) + " bytes" + decompressed);
  }
  bool any_zero = false;
  for (std::size_t i = 0; i < rank; ++i) {
    const std::uint8_t* b = out.bytes.data() + 4 + 4 * i;
    out.dims[i] = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
                  (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
    any_zero = any_zero || out.dims[i] == 0;
  }
  // The same bound as read_idx (what a byte vector can hold), so both accept the same files.
  const std::size_t limit = std::vector<std::uint8_t>().max_size();
  std::size_t total = any_zero ? 0 : 1;
  for (std::size_t i = 0; i < rank && total != 0; ++i) {
    const std::size_t d = out.dims[i];
    if (total > limit / d) {
      throw data_error(where + "header promises " + idx_promise(out.dims, "") +
                       " of data: expected a size that fits in memory");
    }
    total *= d;
  }
  out.data_bytes = total;
  out.promise = idx_promise(out.dims, std::to_string(total));
  return out;
}

/// read_idx, accepting any rank in min_rank..max_rank (1 <= min_rank <= max_rank <= 255).
LOOM_DECL idx_array read_idx_ranked(const std::filesystem::path& file, std::size_t min_rank,
                                    std::size_t max_rank);

}  // namespace detail

/// Reads an IDX file of unsigned bytes with `expected_rank` dimensions (magic number
/// 0x000008NN, NN = expected_rank): raw, or gzip-compressed when the file starts with the gzip
/// magic bytes 1f 8b (the file name does not matter).
///
/// Requires: 1 <= expected_rank <= 255.
/// Throws: loom::invalid_argument for a bad expected_rank; loom::io_error when the file cannot
/// be opened or read; loom::data_error when it is empty, has a wrong magic number, is truncated,
/// has bytes after the data, or is a corrupt gzip stream. Every message starts with
/// "loom: FILE: " and says what was expected and what was found.
LOOM_DECL idx_array read_idx(const std::filesystem::path& file, std::size_t expected_rank);

}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/idx.ipp"
#endif
