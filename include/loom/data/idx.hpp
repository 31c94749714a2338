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
inline std::string idx_prefix(const std::filesystem::path& file) {
  return "loom: " + file.string() + ": ";
}

inline std::string idx_hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(v));
  return buf;
}

inline std::string idx_dimensions(std::size_t rank) {
  return std::to_string(rank) + (rank == 1 ? " dimension" : " dimensions");
}

/// What a magic number means, " (unsigned bytes, 3 dimensions)", or "" when it is no IDX magic.
inline std::string idx_describe_magic(std::uint32_t magic) {
  if ((magic >> 16) != 0 || (magic & 0xFFu) == 0) return "";
  const char* type = nullptr;
  switch ((magic >> 8) & 0xFFu) {
    case 0x08:
      type = "unsigned bytes";
      break;
    case 0x09:
      type = "signed bytes";
      break;
    case 0x0B:
      type = "16-bit integers";
      break;
    case 0x0C:
      type = "32-bit integers";
      break;
    case 0x0D:
      type = "32-bit floats";
      break;
    case 0x0E:
      type = "64-bit floats";
      break;
    default:
      return "";
  }
  return std::string(" (") + type + ", " + idx_dimensions(magic & 0xFFu) + ")";
}

/// The magic numbers accepted for ranks min_rank..max_rank, in words.
inline std::string idx_expected_magic(std::size_t min_rank, std::size_t max_rank) {
  const std::uint32_t lo =
      (std::uint32_t{idx_ubyte_type} << 8) | static_cast<std::uint32_t>(min_rank);
  if (min_rank == max_rank) return idx_hex(lo) + idx_describe_magic(lo);
  const std::uint32_t hi =
      (std::uint32_t{idx_ubyte_type} << 8) | static_cast<std::uint32_t>(max_rank);
  return idx_hex(lo) + ".." + idx_hex(hi) + " (unsigned bytes, " + std::to_string(min_rank) +
         " or more dimensions)";
}

/// "60000 x 28 x 28 = 47040000 bytes"; "10 bytes" for one dimension; no " = ..." if total is "".
inline std::string idx_promise(const std::vector<std::uint32_t>& dims, const std::string& total) {
  std::string out;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) out += " x ";
    out += std::to_string(dims[i]);
  }
  if (dims.size() != 1 && !total.empty()) out += " = " + total;
  return out + " bytes";
}

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

/// A byte stream over one file that inflates it transparently when it starts with the gzip
/// magic bytes 1f 8b. Concatenated gzip members are read as one stream, as gzip does.
class idx_input {
 public:
  explicit idx_input(const std::filesystem::path& file) : path_(file) {
    errno = 0;
    file_.reset(std::fopen(file.c_str(), "rb"));
    if (!file_) {
      const int err = errno;
      throw io_error(idx_prefix(path_) +
                     "cannot open: " + (err ? std::strerror(err) : "unknown error"));
    }
    // Peek at the first two bytes to tell gzip from raw, then hand them back to the reader.
    peek_len_ = read_file(peek_.data(), peek_.size());
    gzip_ = peek_len_ == 2 && peek_[0] == 0x1F && peek_[1] == 0x8B;
    if (gzip_) {
      in_.resize(std::size_t{1} << 16);
      zs_ = std::make_unique<z_stream>();
      std::memset(zs_.get(), 0, sizeof(z_stream));
      const int rc = inflateInit2(zs_.get(), 16 + MAX_WBITS);  // gzip wrapper only
      if (rc != Z_OK) {
        zs_.reset();
        throw io_error(idx_prefix(path_) + "cannot start gzip decompression: " + zlib_text(rc));
      }
    }
  }
  idx_input(const idx_input&) = delete;
  idx_input& operator=(const idx_input&) = delete;
  ~idx_input() {
    if (zs_) inflateEnd(zs_.get());
  }

  bool gzip() const noexcept { return gzip_; }

  /// Reads up to n bytes into dst; fewer only at the end of the (decompressed) data.
  std::size_t read(std::uint8_t* dst, std::size_t n) {
    return gzip_ ? read_inflated(dst, n) : read_raw(dst, n);
  }

  /// Reads and discards everything left; returns how many bytes that was.
  std::uint64_t drain() {
    std::array<std::uint8_t, 4096> scratch;
    std::uint64_t total = 0;
    for (;;) {
      const std::size_t got = read(scratch.data(), scratch.size());
      total += got;
      if (got < scratch.size()) return total;
    }
  }

 private:
  static std::string zlib_text(int rc) {
    switch (rc) {
      case Z_MEM_ERROR:
        return "out of memory";
      case Z_VERSION_ERROR:
        return "incompatible zlib version";
      case Z_STREAM_ERROR:
        return "inconsistent stream state";
      default:
        return "zlib error " + std::to_string(rc);
    }
  }

  std::size_t read_file(std::uint8_t* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      errno = 0;
      const std::size_t k = std::fread(dst + got, 1, n - got, file_.get());
      got += k;
      if (k == 0) {
        if (std::ferror(file_.get())) {
          const int err = errno;
          throw io_error(idx_prefix(path_) +
                         "read failed: " + (err ? std::strerror(err) : "unknown error"));
        }
        break;  // end of file
      }
    }
    return got;
  }

  std::size_t read_raw(std::uint8_t* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n && peek_pos_ < peek_len_) dst[got++] = peek_[peek_pos_++];
    if (got < n) got += read_file(dst + got, n - got);
    return got;
  }

  std::size_t read_inflated(std::uint8_t* dst, std::size_t n) {
    z_stream& zs = *zs_;
    std::size_t got = 0;
    while (got < n && !finished_) {
      if (zs.avail_in == 0) {
        const std::size_t k = read_raw(in_.data(), in_.size());
        zs.next_in = in_.data();
        zs.avail_in = static_cast<uInt>(k);
        if (k == 0) {
          if (member_ended_) {
            finished_ = true;
            break;
          }
          throw data_error(idx_prefix(path_) +
                           "gzip stream is truncated: expected more compressed data before the "
                           "end-of-stream marker, found the end of the file");
        }
      }
      if (member_ended_) {  // more input after a complete member: the next member starts
        inflateReset(&zs);
        member_ended_ = false;
      }
      const std::size_t want = std::min<std::size_t>(n - got, UINT_MAX);
      zs.next_out = dst + got;
      zs.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&zs, Z_NO_FLUSH);
      got += want - zs.avail_out;
      if (rc == Z_STREAM_END) {
        member_ended_ = true;
      } else if (rc == Z_NEED_DICT) {
        throw data_error(idx_prefix(path_) +
                         "corrupt gzip stream: expected plain deflate data, found a request for a "
                         "preset dictionary");
      } else if (rc == Z_DATA_ERROR) {
        throw data_error(idx_prefix(path_) +
                         "corrupt gzip stream: " + (zs.msg ? zs.msg : "invalid compressed data"));
      } else if (rc == Z_MEM_ERROR || rc == Z_STREAM_ERROR) {
        throw io_error(idx_prefix(path_) + "gzip decompression failed: " + zlib_text(rc));
      }
      // Z_OK, or Z_BUF_ERROR when all input is used up: the loop refills the input.
    }
    return got;
  }

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
inline idx_array read_idx_ranked(const std::filesystem::path& file, std::size_t min_rank,
                                 std::size_t max_rank) {
  idx_input in(file);
  const std::string where = idx_prefix(file);
  const std::string decompressed = in.gzip() ? " after decompression" : "";
  const idx_header header = read_idx_header(in, file, min_rank, max_rank, decompressed);
  const std::size_t rank = header.dims.size();
  const std::size_t total = header.data_bytes;
  const std::string& promise = header.promise;
  idx_array out;
  out.path = file;
  out.dims = header.dims;

  // Data: grow the buffer as bytes arrive, so a lying header cannot force a huge allocation.
  std::size_t got = 0;
  while (got < total) {
    const std::size_t step = std::max<std::size_t>(got, std::size_t{1} << 20);
    const std::size_t want = std::min(total, got + step);
    out.data.resize(want);
    const std::size_t k = in.read(out.data.data() + got, want - got);
    got += k;
    if (got < want) {
      throw data_error(where + "file is truncated: header promises " + promise +
                       " of data, found " + std::to_string(got) + decompressed);
    }
  }

  // Nothing may follow the data (reading to the end also lets zlib verify the gzip checksum).
  const std::uint64_t extra = in.drain();
  if (extra != 0) {
    throw data_error(where + std::to_string(extra) + " unexpected bytes after the data" +
                     decompressed + ": expected exactly " + promise + " after the " +
                     std::to_string(4 + 4 * rank) + "-byte header");
  }
  return out;
}

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
inline idx_array read_idx(const std::filesystem::path& file, std::size_t expected_rank) {
  if (expected_rank < 1 || expected_rank > 255) {
    throw invalid_argument("loom: read_idx(" + file.string() + ", " +
                           std::to_string(expected_rank) + "): expected a rank of 1..255, found " +
                           std::to_string(expected_rank));
  }
  return detail::read_idx_ranked(file, expected_rank, expected_rank);
}

}  // namespace loom::data
