// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of shards.hpp's functions: included at the end of the header (header-only), or
// compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "loom/data/cache.hpp"
#include "loom/data/shards.hpp"
#include "loom/data/tar.hpp"

namespace loom::data {
namespace detail {

inline std::uint64_t shards_fnv1a64(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ULL) noexcept {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

inline std::string shards_hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// A JSON value, as much of JSON as a manifest needs (numbers are kept as text).
struct manifest_value {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  std::string text;
  std::vector<manifest_value> items;
  std::vector<std::pair<std::string, manifest_value>> fields;

  const manifest_value* field(std::string_view key) const {
    for (const auto& [k, v] : fields)
      if (k == key) return &v;
    return nullptr;
  }
};

class manifest_parser {
 public:
  manifest_parser(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}

  manifest_value document() {
    manifest_value v = value(0);
    space();
    if (at_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw data_error(where_ + "malformed JSON at byte " + std::to_string(at_) + ": " + what);
  }
  void space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\r' || s_[at_] == '\t')) ++at_;
  }
  bool take(char c) {
    space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_ >= s_.size()) fail("unterminated string");
      const char c = s_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) fail("unterminated escape");
      const char e = s_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (at_ + 4 > s_.size()) fail("a short \\u escape");
          unsigned cp = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = s_[at_++];
            cp = cp * 16 + static_cast<unsigned>(h >= '0' && h <= '9'   ? h - '0'
                                                 : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                 : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                                        : (fail("a bad \\u escape"), 0));
          }
          // UTF-8 of the code point (file names; surrogate pairs are not joined).
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: fail(std::string("an unknown escape \\") + e);
      }
    }
  }
  manifest_value value(int depth) {
    if (depth > 16) fail("nested too deeply");
    space();
    if (at_ >= s_.size()) fail("unexpected end");
    manifest_value v;
    const char c = s_[at_];
    if (c == '{') {
      ++at_;
      v.type = manifest_value::kind::object;
      if (take('}')) return v;
      do {
        space();
        std::string key = string();
        expect(':');
        v.fields.emplace_back(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++at_;
      v.type = manifest_value::kind::array;
      if (take(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.type = manifest_value::kind::string;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = manifest_value::kind::number;
      const std::size_t b = at_;
      while (at_ < s_.size() && (std::strchr("+-.eE", s_[at_]) || (s_[at_] >= '0' && s_[at_] <= '9'))) ++at_;
      v.text = std::string(s_.substr(b, at_ - b));
    } else if (s_.substr(at_, 4) == "true" || s_.substr(at_, 5) == "false") {
      v.type = manifest_value::kind::boolean;
      v.text = s_[at_] == 't' ? "true" : "false";
      at_ += v.text.size();
    } else if (s_.substr(at_, 4) == "null") {
      at_ += 4;
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  std::string_view s_;
  std::string where_;
  std::size_t at_ = 0;
};

inline std::uint64_t manifest_u64(const manifest_value& obj, std::string_view key, const std::string& where) {
  const manifest_value* v = obj.field(key);
  if (!v) throw data_error(where + "field \"" + std::string(key) + "\" is missing");
  const bool digits = v->type == manifest_value::kind::number && !v->text.empty() && v->text.size() <= 19 &&
                      std::all_of(v->text.begin(), v->text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) throw data_error(where + "field \"" + std::string(key) + "\" holds '" + v->text +
                                "': expected a non-negative integer");
  return std::stoull(v->text);
}

/// PREFIX of a shard's file name (see manifest_path_for), and whether it has one.
inline std::string shard_name_prefix(const std::string& name) {
  const std::size_t cut = name.find_last_of("-_");
  if (cut != std::string::npos && cut > 0) return name.substr(0, cut);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tar") == 0) return name.substr(0, name.size() - 4);
  return name;
}

inline std::string shards_where(const std::filesystem::path& file) { return "loom: manifest " + file.string() + ": "; }

/// An exclusive flock held on a file until destruction (nothing when the file cannot be made).
class file_lock {
 public:
  explicit file_lock(const std::filesystem::path& p) {
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ >= 0) {
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  file_lock(const file_lock&) = delete;
  file_lock& operator=(const file_lock&) = delete;
  ~file_lock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  int fd_ = -1;
};

}  // namespace detail

LOOM_DECL std::uint64_t shard_manifest::samples() const noexcept {
  std::uint64_t n = 0;
  for (const shard_info& s : shards) n += s.samples;
  return n;
}

LOOM_DECL std::string shard_manifest::fingerprint() const {
  std::uint64_t h = detail::shards_fnv1a64("loom_shards 1\n");
  for (const shard_info& s : shards)
    h = detail::shards_fnv1a64(s.path.filename().string() + "\n" + std::to_string(s.bytes) + "\n" +
                                   std::to_string(s.samples) + "\n",
                               h);
  return detail::shards_hex64(h);
}

LOOM_DECL std::string manifest_json(const shard_manifest& m, const std::filesystem::path& dir) {
  const auto quote = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  };
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
  std::string out = "{\"loom_shards\": " + std::to_string(manifest_format_version) +
                    ", \"classes\": " + std::to_string(m.classes) + ", \"samples\": " + std::to_string(m.samples()) +
                    ", \"shards\": [";
  for (std::size_t i = 0; i < m.shards.size(); ++i) {
    const shard_info& s = m.shards[i];
    std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(s.path, ec), ec);
    const std::string name = p.parent_path() == base ? p.filename().string() : p.string();
    out += std::string(i ? ",\n" : "\n") + "  {\"file\": " + quote(name) + ", \"bytes\": " + std::to_string(s.bytes) +
           ", \"samples\": " + std::to_string(s.samples) + "}";
  }
  return out + "\n]}\n";
}

LOOM_DECL shard_manifest parse_manifest(std::string_view text, const std::filesystem::path& dir,
                                        const std::filesystem::path& file) {
  const std::string where = detail::shards_where(file);
  const detail::manifest_value doc = detail::manifest_parser(text, where).document();
  if (doc.type != detail::manifest_value::kind::object) throw data_error(where + "expected a JSON object");
  const std::uint64_t version = detail::manifest_u64(doc, "loom_shards", where);
  if (version != static_cast<std::uint64_t>(manifest_format_version))
    throw data_error(where + "format version " + std::to_string(version) + ": this loom reads version " +
                     std::to_string(manifest_format_version));
  shard_manifest m;
  m.classes = static_cast<std::size_t>(detail::manifest_u64(doc, "classes", where));
  const std::uint64_t total = detail::manifest_u64(doc, "samples", where);
  const detail::manifest_value* list = doc.field("shards");
  if (!list || list->type != detail::manifest_value::kind::array)
    throw data_error(where + "field \"shards\" is " + (list ? "not an array" : "missing") +
                     ": expected a list of {\"file\", \"bytes\", \"samples\"}");
  for (std::size_t i = 0; i < list->items.size(); ++i) {
    const detail::manifest_value& e = list->items[i];
    const std::string at = where + "shard " + std::to_string(i) + ": ";
    if (e.type != detail::manifest_value::kind::object) throw data_error(at + "expected an object");
    const detail::manifest_value* f = e.field("file");
    if (!f || f->type != detail::manifest_value::kind::string || f->text.empty())
      throw data_error(at + "field \"file\" is missing or not a non-empty string");
    shard_info s;
    s.path = std::filesystem::path(f->text).is_absolute() ? std::filesystem::path(f->text) : dir / f->text;
    s.bytes = detail::manifest_u64(e, "bytes", at);
    s.samples = detail::manifest_u64(e, "samples", at);
    m.shards.push_back(std::move(s));
  }
  if (m.samples() != total)
    throw data_error(where + "\"samples\" says " + std::to_string(total) + ", the shards' counts sum to " +
                     std::to_string(m.samples()) + ": expected them equal");
  return m;
}

LOOM_DECL shard_manifest read_manifest(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw io_error(detail::shards_where(file) + "cannot open: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw io_error(detail::shards_where(file) + "cannot read");
  return parse_manifest(ss.str(), file.parent_path(), file);
}

LOOM_DECL void write_manifest(const std::filesystem::path& file, const shard_manifest& m) {
  const std::string text = manifest_json(m, file.parent_path());
  const std::filesystem::path temp = file.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error("loom: cannot write manifest " + temp.string() + ": " + std::strerror(errno));
  bool ok = true;
  std::size_t done = 0;
  while (ok && done < text.size()) {
    const ::ssize_t k = ::write(fd, text.data() + done, text.size() - done);
    if (k < 0 && errno == EINTR) continue;
    ok = k > 0;
    if (ok) done += static_cast<std::size_t>(k);
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(temp.c_str(), file.c_str()) != 0) {
    const int e = ok ? errno : err;
    (void)::unlink(temp.c_str());
    throw io_error("loom: cannot write manifest " + file.string() + ": " + std::strerror(e));
  }
}

LOOM_DECL std::vector<std::string> expand_braces(std::string_view p) {
  const std::size_t open = p.find('{');
  if (open == std::string_view::npos) {
    if (p.find('}') != std::string_view::npos)
      throw invalid_argument("loom: shard pattern '" + std::string(p) + "' has a '}' without its '{'");
    return {std::string(p)};
  }
  int depth = 0;
  std::size_t close = std::string_view::npos;
  std::vector<std::size_t> commas;
  for (std::size_t i = open; i < p.size(); ++i) {
    if (p[i] == '{') ++depth;
    if (p[i] == '}' && --depth == 0) {
      close = i;
      break;
    }
    if (p[i] == ',' && depth == 1) commas.push_back(i);
  }
  if (close == std::string_view::npos)
    throw invalid_argument("loom: shard pattern '" + std::string(p) + "' has a '{' without its '}'");
  const std::string_view head = p.substr(0, open), body = p.substr(open + 1, close - open - 1),
                         tail = p.substr(close + 1);
  std::vector<std::string> alternatives;
  const std::size_t dots = body.find("..");
  const auto all_digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (commas.empty() && dots != std::string_view::npos && all_digits(body.substr(0, dots)) &&
      all_digits(body.substr(dots + 2))) {
    const std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
    const std::uint64_t lo = std::stoull(std::string(a)), hi = std::stoull(std::string(b));
    const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const std::size_t width = padded ? std::max(a.size(), b.size()) : 0;
    const std::uint64_t count = (hi >= lo ? hi - lo : lo - hi) + 1;
    if (count > 10'000'000)
      throw invalid_argument("loom: shard pattern '" + std::string(p) + "' names " + std::to_string(count) +
                             " shards: expected at most 10^7");
    for (std::uint64_t k = 0; k < count; ++k) {
      const std::uint64_t v = hi >= lo ? lo + k : lo - k;
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      alternatives.push_back(std::move(s));
    }
  } else if (!commas.empty()) {
    std::size_t from = open + 1;
    commas.push_back(close);
    for (std::size_t c : commas) {
      for (std::string& s : expand_braces(p.substr(from, c - from))) alternatives.push_back(std::move(s));
      from = c + 1;
    }
  } else {
    // "{x}" with neither a range nor a comma stays literal, as in braceexpand.
    alternatives.push_back("{" + std::string(body) + "}");
  }
  std::vector<std::string> out;
  const std::vector<std::string> rest = expand_braces(tail);
  for (const std::string& a : alternatives)
    for (const std::string& r : rest) out.push_back(std::string(head) + a + r);
  return out;
}

LOOM_DECL std::vector<std::filesystem::path> resolve_shards(const std::string& source, const std::string& split) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  std::error_code ec;
  if (source.find('{') != std::string::npos) {
    for (const std::string& s : expand_braces(source)) {
      if (!fs::exists(s, ec))
        throw io_error("loom: shard " + s + " (from the pattern " + source + ") does not exist");
      out.emplace_back(s);
    }
    return out;
  }
  if (!fs::exists(source, ec))
    throw io_error("loom: shards: " + source +
                   " does not exist: expected a directory of .tar shards, a brace pattern, a .tar file or a list file");
  if (fs::is_directory(source, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(source, ec)) {
      const std::string name = e.path().filename().string();
      const bool tar = name.size() > 4 && name.compare(name.size() - 4, 4, ".tar") == 0;
      const bool in_split = split.empty() || name.rfind(split + "-", 0) == 0;
      if (tar && in_split && e.is_regular_file(ec)) out.push_back(e.path());
    }
    if (ec) throw io_error("loom: shards: cannot list " + source + ": " + ec.message());
    std::sort(out.begin(), out.end());
    if (out.empty())
      throw io_error("loom: shards: directory " + source + " holds no " + (split.empty() ? "" : split + "-") +
                     "*.tar shards");
    return out;
  }
  if (source.size() > 4 && source.compare(source.size() - 4, 4, ".tar") == 0) return {fs::path(source)};
  std::ifstream in(source);
  if (!in) throw io_error("loom: shard list " + source + ": cannot open: " + std::strerror(errno));
  const fs::path base = fs::path(source).parent_path();
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    std::size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#') continue;
    const fs::path p = line.substr(b);
    out.push_back(p.is_absolute() ? p : base / p);
  }
  if (out.empty()) throw io_error("loom: shard list " + source + " names no shard: expected one path per line");
  return out;
}

LOOM_DECL std::filesystem::path manifest_path_for(const std::vector<std::filesystem::path>& shards) {
  if (shards.empty()) return {};
  const std::filesystem::path dir = shards.front().parent_path();
  const std::string prefix = detail::shard_name_prefix(shards.front().filename().string());
  for (const auto& s : shards)
    if (s.parent_path() != dir || detail::shard_name_prefix(s.filename().string()) != prefix) return {};
  return dir / (prefix + ".shards.json");
}

LOOM_DECL shard_scan scan_shard(const std::filesystem::path& shard) {
  shard_scan out;
  tar_sample_reader r(shard, 0);
  out.bytes = r.reader().file_size();
  tar_sample s;
  try {
    while (r.next(s, /*want_image=*/false)) {
      ++out.samples;
      if (s.label > out.max_label) out.max_label = s.label;
    }
  } catch (const data_error& e) {
    out.problem = e.what();
  }
  if (out.problem.empty() && out.samples == 0)
    out.problem = detail::shard_prefix(shard) + "holds no samples (" + std::to_string(out.bytes) +
                  " bytes): expected at least one group of files sharing a key";
  return out;
}

LOOM_DECL shard_manifest load_manifest(const std::vector<std::filesystem::path>& shards,
                                       const manifest_options& options) {
  namespace fs = std::filesystem;
  if (shards.empty()) throw invalid_argument("loom: load_manifest: expected at least one shard, found none");
  // Every shard's size and modification time (the cache's key), without opening any.
  struct stamp {
    std::uint64_t bytes;
    long long mtime_ns;
  };
  std::vector<stamp> stats;
  std::string identity = "loom_shards 1\n";
  for (const fs::path& p : shards) {
    struct ::stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      const int err = errno;
      throw io_error("loom: shard " + p.string() + ": cannot stat: " + std::strerror(err) +
                     (err == ENOENT ? " (the shard is missing)" : ""));
    }
    if (!S_ISREG(st.st_mode)) throw io_error("loom: shard " + p.string() + " is not a regular file");
    const long long ns = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    stats.push_back({static_cast<std::uint64_t>(st.st_size), ns});
    std::error_code ec;
    identity += fs::absolute(p, ec).lexically_normal().string() + "\n" + std::to_string(st.st_size) + " " +
                std::to_string(ns) + "\n";
  }

  // 1. The manifest beside the shards.
  const fs::path beside = manifest_path_for(shards);
  std::error_code ec;
  if (!beside.empty() && fs::exists(beside, ec)) {
    const shard_manifest m = read_manifest(beside);
    std::map<std::string, const shard_info*> by_path;
    for (const shard_info& s : m.shards) by_path[fs::weakly_canonical(s.path, ec).string()] = &s;
    shard_manifest out;
    out.classes = m.classes;
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const auto it = by_path.find(fs::weakly_canonical(shards[i], ec).string());
      if (it == by_path.end())
        throw data_error(detail::shards_where(beside) + "does not list shard " + shards[i].string() +
                         ": expected every shard of the set in it (rewrite it with loom-shards --scan, or remove it "
                         "to have the shards scanned)");
      if (it->second->bytes != stats[i].bytes)
        throw data_error(detail::shards_where(beside) + "shard " + shards[i].string() + " has " +
                         std::to_string(stats[i].bytes) + " bytes, the manifest says " +
                         std::to_string(it->second->bytes) +
                         ": the shard changed since the manifest was written (rewrite it with loom-shards --scan)");
      out.shards.push_back({shards[i], stats[i].bytes, it->second->samples});
    }
    return out;
  }

  // 2. loom's cache, and 3. a scan.
  std::optional<fs::path> cached;
  std::optional<detail::file_lock> lock;
  const detail::file_checksum key_sum = detail::checksum_bytes(identity.data(), identity.size());
  if (options.use_cache) {
    const fs::path dir = options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
    if (std::string why = detail::open_private_dir(dir); !why.empty()) {
      detail::warn_cache_refused(dir, why, "scanning the shards' headers without caching the result");
    } else {
      const std::string key = detail::shards_hex64(detail::shards_fnv1a64(identity));
      cached = dir / ("shards-" + key + ".shards.json");
      lock.emplace(dir / ("shards-" + key + ".lock"));
      if (detail::cached_copy_problem(*cached, key_sum).empty()) {
        try {
          shard_manifest m = read_manifest(*cached);
          bool same = m.shards.size() == shards.size();
          for (std::size_t i = 0; same && i < shards.size(); ++i) same = m.shards[i].bytes == stats[i].bytes;
          if (same) {
            for (std::size_t i = 0; i < shards.size(); ++i) m.shards[i].path = shards[i];
            return m;
          }
        } catch (const io_error&) {
          // A stamped copy that does not parse: scanned again below, and replaced.
        }
      }
    }
  }
  std::vector<shard_scan> scans(shards.size());
  std::vector<std::string> errors(shards.size());
  std::atomic<std::size_t> next{0};
  const std::size_t threads =
      std::max<std::size_t>(1, std::min(shards.size(), options.scan_threads ? options.scan_threads : 8));
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < shards.size();) {
      try {
        scans[i] = scan_shard(shards[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  };
  {
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
  }
  shard_manifest out;
  bool whole = true;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (!errors[i].empty()) throw io_error(errors[i]);  // cannot even open it: the set is not there
    if (!scans[i].problem.empty()) {
      if (options.on_bad == on_bad_sample::fail)
        throw data_error(scans[i].problem + " (found while scanning the shards for their manifest)");
      std::fprintf(stderr, "loom: warning: %s; counting the %llu samples before it\n", scans[i].problem.c_str(),
                   static_cast<unsigned long long>(scans[i].samples));
      whole = false;
    }
    out.shards.push_back({shards[i], stats[i].bytes, scans[i].samples});
  }
  // The labels seen do not say how many classes there are (a bad one would say too many): the
  // data set's type decides, checking each label as it is read.
  out.classes = 0;
  if (cached && whole) {
    try {
      write_manifest(*cached, out);
      std::string written = manifest_json(out, cached->parent_path());
      detail::write_stamp(*cached, {key_sum, detail::checksum_bytes(written.data(), written.size())});
    } catch (const io_error& e) {
      detail::warn_cache_refused(cached->parent_path(), e.what(), "the scan is not cached");
    }
  }
  return out;
}

}  // namespace loom::data
