// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tar archives as WebDataset shards: a sequential reader (POSIX ustar, GNU long names, pax
// headers) that hands out regular files and groups them into samples by basename, and the
// ustar writer loom-shards uses. Not a general tar tool: no sparse files, links or extraction.
// POSIX only (pread, posix_fadvise).

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::data {

/// A regular file inside a tar archive. Offsets are bytes from the start of the archive:
/// `header_offset` is the first header block that belongs to it (a GNU long-name or pax header
/// when it has one), `data_offset` where its `size` bytes of data start.
struct tar_entry {
  std::string name;
  std::uint64_t size = 0;
  std::uint64_t header_offset = 0;
  std::uint64_t data_offset = 0;
};

/// A member name split as webdataset splits it: the key is everything before the first dot of
/// the file name (its directory included), the extension everything after it, lower-cased:
/// "dir/000123.JPG" -> {"dir/000123", "jpg"}, "a/b.seg.png" -> {"a/b", "seg.png"}. A name
/// without a dot in its file name, or whose file name starts with a dot, has no key ("").
struct member_name {
  std::string key;
  std::string extension;
};

LOOM_DECL member_name split_member_name(std::string_view name);

/// What a member is to the shard reader, by its extension: "jpg", "jpeg", "png" an image;
/// "cls", "txt" a class index in decimal text; anything else ("json", ...) ignored.
enum class member_kind { image, label, ignored };

LOOM_DECL member_kind kind_of_extension(std::string_view extension) noexcept;

/// A class index written as decimal text, surrounded by optional ASCII white space ("7",
/// "7\n", " -1 "). Empty when the text is not one integer that fits in 63 bits.
LOOM_DECL std::optional<std::int64_t> parse_class_index(std::string_view text) noexcept;

/// Why a sample cannot be used, as the shard loader counts them.
enum class sample_problem {
  none,
  no_image,            ///< no .jpg, .jpeg or .png member
  two_images,          ///< more than one
  no_label,            ///< no .cls or .txt member
  two_labels,          ///< two .cls (or two .txt) members
  label_not_a_number,  ///< the label's text is not a decimal integer
  label_out_of_range,  ///< negative, or not below the number of classes
  not_consecutive,     ///< its key appeared earlier in the shard, before other keys
  bad_image,           ///< the image does not decode (the pipeline threw)
  damaged_shard,       ///< the shard is damaged or cut short before the sample
  unreadable_shard,    ///< the shard cannot be opened or read
};

/// The number of sample_problem values.
inline constexpr std::size_t sample_problem_count = 11;

/// "without an image", "with two images", ..., for counts: "3 samples without a label".
LOOM_DECL const char* describe(sample_problem p) noexcept;

namespace detail {

inline constexpr std::size_t tar_block = 512;
/// Tar pads an archive to a whole record of 20 blocks (GNU tar's and Python's default).
inline constexpr std::size_t tar_record = 20 * tar_block;
/// The default read size: large sequential reads, which network file systems reward.
inline constexpr std::size_t tar_read_size = std::size_t{4} << 20;
/// Upper bounds on GNU long-name and pax header data: anything larger is a damaged archive.
inline constexpr std::uint64_t tar_max_long_name = std::uint64_t{1} << 16;
inline constexpr std::uint64_t tar_max_pax_header = std::uint64_t{1} << 20;

/// "loom: shard FILE: " — the start of every message about one shard.
LOOM_DECL std::string shard_prefix(const std::filesystem::path& file);

/// A header block: the ustar fields of `name` (split into the ustar prefix and name fields when
/// longer than 100 bytes), `size`, `mtime`, mode 0644, typeflag `type` and the checksum.
/// `gnu_magic` writes the old GNU magic "ustar  " instead of POSIX "ustar\0" "00".
/// Throws loom::invalid_argument for a name that fits neither form (then write a pax or GNU
/// long-name header first, as the tests do) or a size of 8 GiB or more.
LOOM_DECL std::array<char, tar_block> tar_header_block(std::string_view name, std::uint64_t size, char type = '0',
                                                       std::uint64_t mtime = 0, bool gnu_magic = false);

/// The parsed fields of one header block, before GNU long names and pax records are applied.
struct tar_header_fields {
  std::string name;
  std::uint64_t size = 0;
  char type = '0';
};

/// Checks the checksum of the header block at byte `offset` of `file` and parses it.
/// Throws loom::data_error naming the file, the offset, the field, what was expected and what
/// was found.
LOOM_DECL tar_header_fields parse_tar_header(const unsigned char* block, const std::filesystem::path& file,
                                             std::uint64_t offset);

/// Applies the records of a pax extended header ("LEN KEY=VALUE\n"...) to `records`.
/// Throws loom::data_error for a malformed record.
LOOM_DECL void parse_pax_records(std::string_view data, std::map<std::string, std::string>& records,
                                 const std::string& where);

}  // namespace detail

/// Reads a tar archive from the start to the end, one regular file at a time, with large
/// sequential reads (`read_size` bytes, 4 MiB by default, through pread; the file is opened
/// with posix_fadvise(SEQUENTIAL)). Skipping a member's data that lies beyond the buffer moves
/// past it without reading it.
///
/// Understands POSIX ustar (the prefix field), old GNU tar (GNU magic), GNU long names
/// (`././@LongLink`, typeflag 'L'; 'K' long link names are skipped), pax extended headers
/// (typeflag 'x' for the next member, 'g' for every member after it; their `path` and `size`
/// records are honoured) and GNU base-256 sizes. Directories, links, devices, FIFOs and any
/// other non-regular entry are skipped. Every header's checksum is verified (unsigned or signed
/// byte sum, as GNU tar accepts). The archive ends at a zero block or at the end of the file
/// after a member.
///
/// Throws loom::io_error when the file cannot be opened or read; loom::data_error for a
/// damaged archive (bad checksum, a malformed field, a member cut short by the end of the file,
/// a zero block followed by data), each message naming the shard, the byte offset and what was
/// expected and found.
class tar_reader {
 public:
  explicit tar_reader(const std::filesystem::path& file, std::size_t read_size = detail::tar_read_size);
  tar_reader(const tar_reader&) = delete;
  tar_reader& operator=(const tar_reader&) = delete;
  tar_reader(tar_reader&&) noexcept;
  tar_reader& operator=(tar_reader&&) noexcept;
  ~tar_reader();

  /// The next regular file, or nothing at the end of the archive. The data of the entry
  /// returned before, when neither read nor skipped, is skipped.
  std::optional<tar_entry> next();

  /// The data of the entry next() returned last, appended to nothing: `out` is resized to its
  /// size. Call at most once per entry.
  void read_data(std::vector<std::byte>& out);

  /// The file, its size (at open) and how many bytes were read from it so far.
  const std::filesystem::path& path() const noexcept { return path_; }
  std::uint64_t file_size() const noexcept { return file_size_; }
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  std::size_t read_at(std::uint64_t offset, void* dst, std::size_t n);
  std::string at(std::uint64_t offset) const;

  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t file_size_ = 0;
  std::uint64_t bytes_read_ = 0;
  std::vector<std::byte> buf_;
  std::uint64_t buf_offset_ = 0;  // file offset of buf_[0]
  std::size_t buf_len_ = 0;       // valid bytes in buf_
  std::uint64_t pos_ = 0;         // the next header block
  std::optional<tar_entry> current_;
  bool data_taken_ = true;
  bool ended_ = false;
  std::map<std::string, std::string> globals_;  // pax 'g' records
};

/// One sample of a shard: the members that share a key, consecutive in the archive.
///
/// `offset` is the byte offset of its first member's header, `index` its position among the
/// shard's samples (0-based, counting bad ones). `image` holds the image member's bytes when
/// they were asked for (else it is empty and `image_size` tells its size). `label` is the
/// class index from the .cls member (or the .txt member when there is no .cls). `problem` is
/// empty for a good sample, else a sentence saying what is wrong with it (no image, two images,
/// no label, a label that is no number or out of range, members not consecutive), naming the
/// member and its byte offset; the other fields are then not to be trusted.
struct tar_sample {
  std::string key;
  std::uint64_t offset = 0;
  std::uint64_t index = 0;
  std::string image_member;
  std::uint64_t image_offset = 0;
  std::uint64_t image_size = 0;
  std::vector<std::byte> image;
  std::int64_t label = -1;
  std::string problem;
  sample_problem kind = sample_problem::none;
};

/// Groups a shard's members into samples, as webdataset does: consecutive members with the
/// same key form one sample. A sample's members must be consecutive; a key seen again after
/// other keys is reported as a problem of that later sample.
class tar_sample_reader {
 public:
  /// `classes` bounds the labels (0: no bound).
  explicit tar_sample_reader(const std::filesystem::path& file, std::size_t classes = 0,
                             std::size_t read_size = detail::tar_read_size);

  /// The next sample into `s`; false at the end of the shard. With want_image false the image
  /// bytes are not read (labels-only reads, counting). Throws what tar_reader throws.
  bool next(tar_sample& s, bool want_image);

  const tar_reader& reader() const noexcept { return reader_; }

 private:
  tar_reader reader_;
  std::size_t classes_;
  std::optional<tar_entry> pending_;
  std::uint64_t index_ = 0;
  std::unordered_map<std::string, std::uint64_t> seen_;  // key -> byte offset of its first sample
  std::vector<std::byte> scratch_;                        // a label member's text
};

/// Writes a POSIX ustar archive: regular files with mode 0644, uid and gid 0, the given
/// modification time, then two zero blocks and zero padding to a whole 10240-byte record, as
/// GNU tar and Python's tarfile do. Buffered; nothing is fsync'ed until close().
class tar_writer {
 public:
  /// Creates (or truncates) `file`. Throws loom::io_error when it cannot.
  explicit tar_writer(const std::filesystem::path& file);
  tar_writer(const tar_writer&) = delete;
  tar_writer& operator=(const tar_writer&) = delete;
  ~tar_writer();

  /// Appends a member. Throws loom::invalid_argument for a name ustar cannot hold (see
  /// detail::tar_header_block), loom::io_error when the write fails.
  void add(std::string_view name, std::span<const std::byte> data, std::uint64_t mtime = 0);

  /// The archive's bytes so far (headers and padding included, the end not yet).
  std::uint64_t bytes() const noexcept { return bytes_; }

  /// Writes the end of the archive, fsyncs and closes. Throws loom::io_error on failure.
  void close();

 private:
  void put(const void* p, std::size_t n);
  void flush();

  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<char> buf_;
  std::uint64_t bytes_ = 0;
};

}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/tar.ipp"
#endif
