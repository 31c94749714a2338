// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of idx.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/data/idx.hpp"

namespace loom::data {
namespace detail {

LOOM_DECL std::string idx_prefix(const std::filesystem::path& file) {
  return "loom: " + file.string() + ": ";
}

LOOM_DECL std::string idx_hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(v));
  return buf;
}

LOOM_DECL std::string idx_dimensions(std::size_t rank) {
  return std::to_string(rank) + (rank == 1 ? " dimension" : " dimensions");
}

LOOM_DECL std::string idx_describe_magic(std::uint32_t magic) {
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

LOOM_DECL std::string idx_expected_magic(std::size_t min_rank, std::size_t max_rank) {
  const std::uint32_t lo =
      (std::uint32_t{idx_ubyte_type} << 8) | static_cast<std::uint32_t>(min_rank);
  if (min_rank == max_rank) return idx_hex(lo) + idx_describe_magic(lo);
  const std::uint32_t hi =
      (std::uint32_t{idx_ubyte_type} << 8) | static_cast<std::uint32_t>(max_rank);
  return idx_hex(lo) + ".." + idx_hex(hi) + " (unsigned bytes, " + std::to_string(min_rank) +
         " or more dimensions)";
}

LOOM_DECL std::string idx_promise(const std::vector<std::uint32_t>& dims, const std::string& total) {
  std::string out;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) out += " x ";
    out += std::to_string(dims[i]);
  }
  if (dims.size() != 1 && !total.empty()) out += " = " + total;
  return out + " bytes";
}

LOOM_DECL idx_input::idx_input(const std::filesystem::path& file) : path_(file) {
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

LOOM_DECL idx_input::~idx_input() {
  if (zs_) inflateEnd(zs_.get());
}

LOOM_DECL std::uint64_t idx_input::drain() {
  std::array<std::uint8_t, 4096> scratch;
  std::uint64_t total = 0;
  for (;;) {
    const std::size_t got = read(scratch.data(), scratch.size());
    total += got;
    if (got < scratch.size()) return total;
  }
}

LOOM_DECL std::string idx_input::zlib_text(int rc) {
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

LOOM_DECL std::size_t idx_input::read_file(std::uint8_t* dst, std::size_t n) {
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

LOOM_DECL std::size_t idx_input::read_raw(std::uint8_t* dst, std::size_t n) {
  std::size_t got = 0;
  while (got < n && peek_pos_ < peek_len_) dst[got++] = peek_[peek_pos_++];
  if (got < n) got += read_file(dst + got, n - got);
  return got;
}

LOOM_DECL std::size_t idx_input::read_inflated(std::uint8_t* dst, std::size_t n) {
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

LOOM_DECL idx_array read_idx_ranked(const std::filesystem::path& file, std::size_t min_rank,
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
}  // namespace loom::data

namespace loom::data {

LOOM_DECL idx_array read_idx(const std::filesystem::path& file, std::size_t expected_rank) {
  if (expected_rank < 1 || expected_rank > 255) {
    throw invalid_argument("loom: read_idx(" + file.string() + ", " +
                           std::to_string(expected_rank) + "): expected a rank of 1..255, found " +
                           std::to_string(expected_rank));
  }
  return detail::read_idx_ranked(file, expected_rank, expected_rank);
}
}  // namespace loom::data
