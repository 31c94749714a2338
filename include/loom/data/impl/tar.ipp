// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of tar.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "loom/data/tar.hpp"

namespace loom::data {

LOOM_DECL member_name split_member_name(std::string_view name) {
  const std::size_t slash = name.rfind('/');
  const std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const std::size_t dot = name.find('.', base);
  // webdataset's "^((?:.*/|)[^.]+)[.]([^/]*)$": at least one character before the dot.
  if (dot == std::string_view::npos || dot == base) return {};
  member_name out{std::string(name.substr(0, dot)), std::string(name.substr(dot + 1))};
  for (char& c : out.extension) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  return out;
}

LOOM_DECL const char* describe(sample_problem p) noexcept {
  switch (p) {
    case sample_problem::none: return "without a problem";
    case sample_problem::no_image: return "without an image";
    case sample_problem::two_images: return "with two images";
    case sample_problem::no_label: return "without a label";
    case sample_problem::two_labels: return "with two labels";
    case sample_problem::label_not_a_number: return "whose label is not a number";
    case sample_problem::label_out_of_range: return "whose label is out of range";
    case sample_problem::not_consecutive: return "whose members are not consecutive";
    case sample_problem::bad_image: return "whose image does not decode";
    case sample_problem::damaged_shard: return "in a damaged part of a shard";
    case sample_problem::unreadable_shard: return "in an unreadable shard";
  }
  return "with an unknown problem";
}

LOOM_DECL member_kind kind_of_extension(std::string_view e) noexcept {
  if (e == "jpg" || e == "jpeg" || e == "png") return member_kind::image;
  if (e == "cls" || e == "txt") return member_kind::label;
  return member_kind::ignored;
}

LOOM_DECL std::optional<std::int64_t> parse_class_index(std::string_view t) noexcept {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (!t.empty() && space(t.front())) t.remove_prefix(1);
  while (!t.empty() && space(t.back())) t.remove_suffix(1);
  bool negative = false;
  if (!t.empty() && (t.front() == '-' || t.front() == '+')) {
    negative = t.front() == '-';
    t.remove_prefix(1);
  }
  if (t.empty() || t.size() > 18) return std::nullopt;  // 18 digits always fit in 63 bits
  std::int64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return negative ? -v : v;
}

namespace detail {

LOOM_DECL std::string shard_prefix(const std::filesystem::path& file) { return "loom: shard " + file.string() + ": "; }

// Writes v in octal into a field of `width` bytes: width - 1 digits, zero-padded, then NUL.
inline void tar_put_octal(char* field, std::size_t width, std::uint64_t v) {
  for (std::size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (v & 7));
    v >>= 3;
  }
  field[width - 1] = '\0';
}

inline std::string tar_c_string(const unsigned char* p, std::size_t n) {
  const auto* end = static_cast<const unsigned char*>(std::memchr(p, 0, n));
  return std::string(reinterpret_cast<const char*>(p), end ? static_cast<std::size_t>(end - p) : n);
}

inline std::string tar_printable(std::string_view s, std::size_t max = 40) {
  std::string out;
  for (char c : s.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", u);
      out += hex;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

// An octal field: optional leading spaces, digits, then NUL, space or the field's end.
inline std::optional<std::uint64_t> tar_parse_octal(const unsigned char* p, std::size_t n) {
  std::size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  std::uint64_t v = 0;
  std::size_t digits = 0;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i, ++digits) {
    if (v >> 61) return std::nullopt;
    v = (v << 3) | static_cast<std::uint64_t>(p[i] - '0');
  }
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  if (digits == 0) return std::nullopt;
  return v;
}

inline std::string tar_field_text(const unsigned char* p, std::size_t n) {
  // (Appended piece by piece: "'" + std::string&& draws a false -Wrestrict from GCC 12.)
  std::string out(1, '\'');
  out += tar_printable(std::string_view(reinterpret_cast<const char*>(p), n), n);
  out += '\'';
  return out;
}

LOOM_DECL std::array<char, tar_block> tar_header_block(std::string_view name, std::uint64_t size, char type,
                                                       std::uint64_t mtime, bool gnu_magic) {
  std::array<char, tar_block> h{};
  std::string_view prefix, rest = name;
  if (name.size() > 100) {
    // ustar: prefix (up to 155 bytes) "/" name (up to 100 bytes), split at a slash.
    std::size_t cut = std::string_view::npos;
    for (std::size_t i = name.size(); i-- > 0;)
      if (name[i] == '/' && i <= 155 && name.size() - i - 1 <= 100 && name.size() - i - 1 > 0) {
        cut = i;
        break;
      }
    if (cut == std::string_view::npos || gnu_magic)
      throw invalid_argument("loom: tar: the member name '" + std::string(name) + "' (" + std::to_string(name.size()) +
                             " bytes) does not fit a ustar header: expected at most 100 bytes, or a directory part "
                             "of at most 155 bytes and a file name of at most 100");
    prefix = name.substr(0, cut);
    rest = name.substr(cut + 1);
  }
  if (size >= (std::uint64_t{1} << 33))
    throw invalid_argument("loom: tar: member '" + std::string(name) + "' has " + std::to_string(size) +
                           " bytes: expected less than 8 GiB, what a ustar size field holds");
  std::memcpy(h.data(), rest.data(), rest.size());
  tar_put_octal(h.data() + 100, 8, 0644);
  tar_put_octal(h.data() + 108, 8, 0);
  tar_put_octal(h.data() + 116, 8, 0);
  tar_put_octal(h.data() + 124, 12, size);
  tar_put_octal(h.data() + 136, 12, mtime);
  h[156] = type;
  if (gnu_magic) {
    std::memcpy(h.data() + 257, "ustar  ", 8);  // "ustar" space space NUL
  } else {
    std::memcpy(h.data() + 257, "ustar", 6);  // "ustar" NUL
    std::memcpy(h.data() + 263, "00", 2);
  }
  std::memcpy(h.data() + 345, prefix.data(), prefix.size());
  std::memset(h.data() + 148, ' ', 8);
  std::uint32_t sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  tar_put_octal(h.data() + 148, 7, sum);  // six digits and NUL, then the space that is already there
  return h;
}

LOOM_DECL tar_header_fields parse_tar_header(const unsigned char* b, const std::filesystem::path& file,
                                             std::uint64_t offset) {
  // The messages' start, made only when there is one to give.
  const auto where = [&] { return shard_prefix(file) + "at byte " + std::to_string(offset) + ": "; };
  const std::optional<std::uint64_t> stored = tar_parse_octal(b + 148, 8);
  if (!stored)
    throw data_error(where() + "header checksum field holds " + tar_field_text(b + 148, 8) +
                     ": expected an octal number (is this a tar file?)");
  std::uint64_t usum = 0;
  std::int64_t ssum = 0;
  for (std::size_t i = 0; i < tar_block; ++i) {
    const unsigned char c = (i >= 148 && i < 156) ? ' ' : b[i];
    usum += c;
    ssum += static_cast<signed char>(c);
  }
  if (*stored != usum && static_cast<std::int64_t>(*stored) != ssum) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "bad header checksum: the header says %llo, its bytes sum to %llo",
                  static_cast<unsigned long long>(*stored), static_cast<unsigned long long>(usum));
    throw data_error(where() + buf + " (the archive is damaged)");
  }
  tar_header_fields f;
  f.type = static_cast<char>(b[156]);
  f.name = tar_c_string(b, 100);
  const bool posix = std::memcmp(b + 257, "ustar\0", 6) == 0;
  if (posix && b[345] != 0) f.name = tar_c_string(b + 345, 155) + "/" + f.name;
  if (b[124] & 0x80) {
    // GNU base-256: the other bytes of the field, big-endian (negative sizes make no sense).
    if (b[124] != 0x80 || b[125] != 0 || b[126] != 0 || b[127] != 0)
      throw data_error(where() + "size field " + tar_field_text(b + 124, 12) +
                       " is a base-256 number beyond 2^63 or negative: expected a file size");
    std::uint64_t v = 0;
    for (int i = 128; i < 136; ++i) v = (v << 8) | b[i];
    f.size = v;
  } else {
    const std::optional<std::uint64_t> size = tar_parse_octal(b + 124, 12);
    if (!size) throw data_error(where() + "size field holds " + tar_field_text(b + 124, 12) + ": expected an octal number");
    f.size = *size;
  }
  return f;
}

LOOM_DECL void parse_pax_records(std::string_view d, std::map<std::string, std::string>& records,
                                 const std::string& where) {
  std::size_t at = 0;
  while (at < d.size()) {
    if (d[at] == '\0') break;  // padding some writers leave
    std::size_t len = 0, i = at;
    for (; i < d.size() && d[i] >= '0' && d[i] <= '9' && len < d.size(); ++i) len = len * 10 + (d[i] - '0');
    if (i == at || i >= d.size() || d[i] != ' ' || len <= i - at + 1 || at + len > d.size() || d[at + len - 1] != '\n')
      throw data_error(where + "malformed pax record at byte " + std::to_string(at) + " of the pax header: '" +
                       tar_printable(d.substr(at)) + "': expected \"LENGTH KEY=VALUE\\n\"");
    const std::string_view rec = d.substr(i + 1, at + len - 1 - (i + 1));
    const std::size_t eq = rec.find('=');
    if (eq == std::string_view::npos || eq == 0)
      throw data_error(where + "malformed pax record '" + tar_printable(rec) + "': expected KEY=VALUE");
    records[std::string(rec.substr(0, eq))] = std::string(rec.substr(eq + 1));
    at += len;
  }
}

}  // namespace detail

LOOM_DECL tar_reader::tar_reader(const std::filesystem::path& file, std::size_t read_size) : path_(file) {
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    throw io_error(detail::shard_prefix(path_) + "cannot open: " + std::strerror(err));
  }
  struct ::stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw io_error(detail::shard_prefix(path_) +
                   (err ? std::string("cannot stat: ") + std::strerror(err) : std::string("not a regular file")));
  }
  file_size_ = static_cast<std::uint64_t>(st.st_size);
  // One pass from start to end: let the kernel read ahead as far as it likes.
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  buf_.resize(std::max(read_size, detail::tar_block));
}

LOOM_DECL tar_reader::tar_reader(tar_reader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      file_size_(o.file_size_),
      bytes_read_(o.bytes_read_),
      buf_(std::move(o.buf_)),
      buf_offset_(o.buf_offset_),
      buf_len_(std::exchange(o.buf_len_, 0)),
      pos_(o.pos_),
      current_(std::move(o.current_)),
      data_taken_(o.data_taken_),
      ended_(o.ended_),
      globals_(std::move(o.globals_)) {}

LOOM_DECL tar_reader& tar_reader::operator=(tar_reader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = o.file_size_;
    bytes_read_ = o.bytes_read_;
    buf_ = std::move(o.buf_);
    buf_offset_ = o.buf_offset_;
    buf_len_ = std::exchange(o.buf_len_, 0);
    pos_ = o.pos_;
    current_ = std::move(o.current_);
    data_taken_ = o.data_taken_;
    ended_ = o.ended_;
    globals_ = std::move(o.globals_);
  }
  return *this;
}

LOOM_DECL tar_reader::~tar_reader() {
  if (fd_ >= 0) ::close(fd_);
}

LOOM_DECL std::string tar_reader::at(std::uint64_t offset) const {
  return detail::shard_prefix(path_) + "at byte " + std::to_string(offset) + ": ";
}

LOOM_DECL std::size_t tar_reader::read_at(std::uint64_t offset, void* dst, std::size_t n) {
  auto* out = static_cast<std::byte*>(dst);
  std::size_t got = 0;
  while (got < n) {
    const std::uint64_t o = offset + got;
    if (o >= buf_offset_ && o < buf_offset_ + buf_len_) {
      const std::size_t k = std::min<std::size_t>(n - got, buf_offset_ + buf_len_ - o);
      std::memcpy(out + got, buf_.data() + (o - buf_offset_), k);
      got += k;
      continue;
    }
    if (o >= file_size_) {
      // The size at open: a file that grew since is read no further (a shard is immutable).
      break;
    }
    const bool direct = n - got >= buf_.size();
    std::byte* target = direct ? out + got : buf_.data();
    const std::size_t want = direct ? n - got : buf_.size();
    ::ssize_t k;
    do {
      k = ::pread(fd_, target, want, static_cast<::off_t>(o));
    } while (k < 0 && errno == EINTR);
    if (k < 0) {
      const int err = errno;
      throw io_error(at(o) + "read failed: " + std::strerror(err));
    }
    bytes_read_ += static_cast<std::uint64_t>(k);
    if (k == 0) break;
    if (direct) {
      got += static_cast<std::size_t>(k);
    } else {
      buf_offset_ = o;
      buf_len_ = static_cast<std::size_t>(k);
    }
  }
  return got;
}

LOOM_DECL std::optional<tar_entry> tar_reader::next() {
  if (current_ && !data_taken_) {
    // Skip the data: the header after it is what comes next.
    current_.reset();
  }
  current_.reset();
  if (ended_) return std::nullopt;
  std::optional<std::string> long_name;
  std::map<std::string, std::string> pax;
  std::optional<std::uint64_t> first_header;
  for (;;) {
    const std::uint64_t h = pos_;
    unsigned char block[detail::tar_block];
    const std::size_t got = read_at(h, block, sizeof block);
    if (got == 0 && !long_name && pax.empty()) {
      ended_ = true;  // the end of the file right after a member: an archive without its end blocks
      return std::nullopt;
    }
    if (got < sizeof block)
      throw data_error(at(h) + "the file ends " + std::to_string(got) +
                       " bytes into a 512-byte header block (the shard is truncated: " + std::to_string(file_size_) +
                       " bytes)" + (long_name || !pax.empty() ? ", after a long-name or pax header" : ""));
    if (std::all_of(block, block + sizeof block, [](unsigned char c) { return c == 0; })) {
      if (long_name || !pax.empty())
        throw data_error(at(h) + "a zero block follows a long-name or pax header: expected the header of the member "
                                 "it describes");
      // The end of the archive: a second zero block, or the end of the file, must follow.
      unsigned char second[detail::tar_block];
      const std::size_t got2 = read_at(h + detail::tar_block, second, sizeof second);
      if (got2 == sizeof second && !std::all_of(second, second + sizeof second, [](unsigned char c) { return c == 0; }))
        throw data_error(at(h) + "a lone zero block is followed by more data at byte " +
                         std::to_string(h + detail::tar_block) +
                         ": expected the end of the archive (two zero blocks)");
      ended_ = true;
      return std::nullopt;
    }
    if (!first_header) first_header = h;
    const detail::tar_header_fields f = detail::parse_tar_header(block, path_, h);
    const std::uint64_t data = h + detail::tar_block;
    std::uint64_t size = f.size;
    const char t = f.type;
    const bool regular = t == '0' || t == '\0' || t == '7';
    // pax records override the header's size (a member over 8 GiB has size 0 in its header).
    std::string name = f.name;
    if (regular) {
      if (long_name) name = *long_name;
      auto pick = [&](const char* key) -> const std::string* {
        if (auto it = pax.find(key); it != pax.end()) return &it->second;
        if (auto it = globals_.find(key); it != globals_.end()) return &it->second;
        return nullptr;
      };
      if (const std::string* p = pick("path")) name = *p;
      if (const std::string* s = pick("size")) {
        const std::optional<std::int64_t> v = parse_class_index(*s);
        if (!v || *v < 0)
          throw data_error(at(*first_header) + "pax record size=" + detail::tar_printable(*s) +
                           ": expected a non-negative decimal number");
        size = static_cast<std::uint64_t>(*v);
      }
    }
    const bool has_data = !(t >= '1' && t <= '6');
    const std::uint64_t padded = has_data ? (size + detail::tar_block - 1) / detail::tar_block * detail::tar_block : 0;
    if (has_data && data + size > file_size_)
      throw data_error(at(h) + "member '" + detail::tar_printable(name, 200) + "' promises " + std::to_string(size) +
                       " bytes of data from byte " + std::to_string(data) + ", but the file ends after " +
                       std::to_string(file_size_ > data ? file_size_ - data : 0) + " (the shard is truncated)");
    if (t == 'L' || t == 'x' || t == 'g') {
      const std::uint64_t limit = t == 'L' ? detail::tar_max_long_name : detail::tar_max_pax_header;
      if (size > limit)
        throw data_error(at(h) + (t == 'L' ? "a GNU long name of " : "a pax header of ") + std::to_string(size) +
                         " bytes: expected at most " + std::to_string(limit) + " (the archive is damaged)");
      std::string text(static_cast<std::size_t>(size), '\0');
      (void)read_at(data, text.data(), text.size());
      pos_ = data + padded;
      if (t == 'L') {
        if (const std::size_t z = text.find('\0'); z != std::string::npos) text.resize(z);
        long_name = std::move(text);
      } else {
        detail::parse_pax_records(text, t == 'x' ? pax : globals_, at(h));
      }
      continue;
    }
    pos_ = data + padded;
    if (!regular) {  // directories, links, devices, FIFOs, GNU 'K', 'S', 'V', 'M', vendor types
      long_name.reset();
      pax.clear();
      first_header.reset();
      continue;
    }
    current_ = tar_entry{std::move(name), size, *first_header, data};
    data_taken_ = false;
    return current_;
  }
}

LOOM_DECL void tar_reader::read_data(std::vector<std::byte>& out) {
  if (!current_ || data_taken_) throw invalid_argument("loom: tar_reader::read_data: no entry whose data is unread");
  out.resize(static_cast<std::size_t>(current_->size));
  const std::size_t got = read_at(current_->data_offset, out.data(), out.size());
  data_taken_ = true;
  if (got < out.size())
    throw data_error(at(current_->data_offset) + "member '" + current_->name + "' is cut short: expected " +
                     std::to_string(out.size()) + " bytes of data, found " + std::to_string(got));
}

LOOM_DECL tar_sample_reader::tar_sample_reader(const std::filesystem::path& file, std::size_t classes,
                                               std::size_t read_size)
    : reader_(file, read_size), classes_(classes) {}

LOOM_DECL bool tar_sample_reader::next(tar_sample& s, bool want_image) {
  s.key.clear();
  s.image_member.clear();
  s.image.clear();
  s.problem.clear();
  s.label = -1;
  s.kind = sample_problem::none;
  s.image_offset = s.image_size = 0;
  // The texts of the label members: .cls wins over .txt (which may be a caption elsewhere).
  std::optional<std::string> cls, txt;
  std::string cls_member, txt_member;
  std::uint64_t cls_offset = 0, txt_offset = 0;
  auto problem = [&](sample_problem k, std::string p) {
    if (s.problem.empty()) {
      s.problem = std::move(p);
      s.kind = k;
    }
  };
  for (;;) {
    if (!pending_) pending_ = reader_.next();
    if (!pending_) break;
    const tar_entry& e = *pending_;
    const member_name n = split_member_name(e.name);
    if (n.key.empty()) {  // no key: not part of any sample (webdataset skips it too)
      pending_.reset();
      continue;
    }
    if (s.key.empty()) {
      s.key = n.key;
      s.offset = e.header_offset;
      s.index = index_++;
      if (auto [it, fresh] = seen_.emplace(n.key, e.header_offset); !fresh)
        problem(sample_problem::not_consecutive,
                "sample " + n.key + " at byte " + std::to_string(e.header_offset) +
                ": its members are not consecutive (the key appeared before, at byte " + std::to_string(it->second) +
                "): expected a sample's files next to each other, as webdataset requires");
    } else if (n.key != s.key) {
      break;  // the next sample's first member: kept for the next call
    }
    switch (kind_of_extension(n.extension)) {
      case member_kind::image:
        if (!s.image_member.empty()) {
          problem(sample_problem::two_images,
                  "sample " + s.key + " at byte " + std::to_string(s.offset) + " has two images, " + s.image_member +
                  " and " + e.name + " (at byte " + std::to_string(e.header_offset) + "): expected one");
        } else {
          s.image_member = e.name;
          s.image_offset = e.header_offset;
          s.image_size = e.size;
          if (want_image) reader_.read_data(s.image);
        }
        break;
      case member_kind::label: {
        const bool is_cls = n.extension == "cls";
        std::optional<std::string>& text = is_cls ? cls : txt;
        if (text) {
          problem(sample_problem::two_labels,
                  "sample " + s.key + " at byte " + std::to_string(s.offset) + " has two ." + n.extension +
                  " members: expected one");
          break;
        }
        // A class index is a few digits; anything long is not one (and is not read).
        if (e.size <= 64) {
          reader_.read_data(scratch_);
          text = std::string(reinterpret_cast<const char*>(scratch_.data()), scratch_.size());
        } else {
          text = std::string("(" + std::to_string(e.size) + " bytes)");
        }
        (is_cls ? cls_member : txt_member) = e.name;
        (is_cls ? cls_offset : txt_offset) = e.header_offset;
        break;
      }
      case member_kind::ignored:
        break;
    }
    pending_.reset();
  }
  if (s.key.empty()) return false;
  if (s.image_member.empty())
    problem(sample_problem::no_image, "sample " + s.key + " at byte " + std::to_string(s.offset) +
            " has no image: expected a .jpg, .jpeg or .png member");
  const bool from_cls = cls.has_value();
  const std::optional<std::string>& text = from_cls ? cls : txt;
  if (!text) {
    problem(sample_problem::no_label, "sample " + s.key + " at byte " + std::to_string(s.offset) +
            " has no label: expected a .cls (or .txt) member holding its class index");
  } else {
    const std::string& member = from_cls ? cls_member : txt_member;
    const std::uint64_t offset = from_cls ? cls_offset : txt_offset;
    const std::optional<std::int64_t> v = parse_class_index(*text);
    if (!v) {
      problem(sample_problem::label_not_a_number,
              "label member " + member + " at byte " + std::to_string(offset) + " holds '" + detail::tar_printable(*text) +
              "': expected a decimal class index");
    } else if (*v < 0 || (classes_ && static_cast<std::uint64_t>(*v) >= classes_)) {
      problem(sample_problem::label_out_of_range,
              "label member " + member + " at byte " + std::to_string(offset) + " holds class " + std::to_string(*v) +
              ", out of range: expected 0.." + (classes_ ? std::to_string(classes_ - 1) : std::string("2^63")));
    } else {
      s.label = *v;
    }
  }
  if (!s.problem.empty()) s.problem = detail::shard_prefix(reader_.path()) + s.problem;
  return true;
}

LOOM_DECL tar_writer::tar_writer(const std::filesystem::path& file) : path_(file) {
  fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw io_error("loom: cannot create " + file.string() + ": " + std::strerror(err));
  }
  buf_.reserve(std::size_t{1} << 20);
}

LOOM_DECL tar_writer::~tar_writer() {
  if (fd_ >= 0) ::close(fd_);
}

LOOM_DECL void tar_writer::flush() {
  std::size_t done = 0;
  while (done < buf_.size()) {
    const ::ssize_t k = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (k < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw io_error("loom: cannot write " + path_.string() + ": " + std::strerror(err));
    }
    done += static_cast<std::size_t>(k);
  }
  buf_.clear();
}

LOOM_DECL void tar_writer::put(const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  if (buf_.size() + n > buf_.capacity()) flush();
  if (n >= buf_.capacity()) {
    buf_.assign(c, c + n);
    flush();
  } else {
    buf_.insert(buf_.end(), c, c + n);
  }
  bytes_ += n;
}

LOOM_DECL void tar_writer::add(std::string_view name, std::span<const std::byte> data, std::uint64_t mtime) {
  if (fd_ < 0) throw invalid_argument("loom: tar_writer::add: " + path_.string() + " is already closed");
  const auto h = detail::tar_header_block(name, data.size(), '0', mtime);
  put(h.data(), h.size());
  put(data.data(), data.size());
  static constexpr char zeros[detail::tar_block] = {};
  if (const std::size_t r = data.size() % detail::tar_block) put(zeros, detail::tar_block - r);
}

LOOM_DECL void tar_writer::close() {
  if (fd_ < 0) return;
  static constexpr char zeros[detail::tar_block] = {};
  put(zeros, detail::tar_block);
  put(zeros, detail::tar_block);
  while (bytes_ % detail::tar_record) put(zeros, detail::tar_block);
  flush();
  if (::fsync(fd_) != 0) {
    const int err = errno;
    throw io_error("loom: cannot fsync " + path_.string() + ": " + std::strerror(err));
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    throw io_error("loom: cannot close " + path_.string() + ": " + std::strerror(err));
  }
}

}  // namespace loom::data
