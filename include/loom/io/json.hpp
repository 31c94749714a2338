// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small JSON reader and string quoting, enough for the headers of loom's files (safetensors).
// The reader takes untrusted input: it never reads past its text, limits nesting, and reports
// the byte where the text stops being JSON. Not a general JSON library: numbers keep their text
// and convert on request.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::io::json {

/// The text is not JSON; what() says why and at which byte.
class parse_error : public error {
 public:
  using error::error;
};

/// A parsed JSON value. Objects keep their members in file order.
struct value {
  enum class type { null, boolean, number, string, array, object };
  type kind = type::null;
  bool boolean = false;
  std::string text;  // a string's value, or a number's text
  std::vector<value> items;
  std::vector<std::pair<std::string, value>> members;

  bool is_object() const noexcept { return kind == type::object; }
  bool is_array() const noexcept { return kind == type::array; }
  bool is_string() const noexcept { return kind == type::string; }
  /// The member named key, or null.
  const value* find(std::string_view key) const noexcept {
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
  /// A number that is a non-negative integer fitting in 64 bits, as one; false otherwise.
  bool to_u64(std::uint64_t& out) const noexcept {
    if (kind != type::number) return false;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc{} && p == text.data() + text.size();
  }
};

namespace detail {
class parser {
 public:
  explicit parser(std::string_view s) : s_(s) {}

  value document() {
    value v = parse(0);
    skip_space();
    if (i_ != s_.size()) fail("text after the end of the JSON value");
    return v;
  }

 private:
  static constexpr int max_depth = 64;

  [[noreturn]] void fail(const std::string& why) const {
    throw parse_error(why + " at byte " + std::to_string(i_));
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool take(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) == word) return i_ += word.size(), true;
    return false;
  }

  value parse(int depth) {
    if (depth > max_depth) fail("nesting deeper than " + std::to_string(max_depth));
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end of the text");
    value v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = value::type::object;
      if (take('}')) return v;
      do {
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a member name in quotes");
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), parse(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = value::type::array;
      if (take(']')) return v;
      do v.items.push_back(parse(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = value::type::string;
      v.text = string();
    } else if (literal("true")) {
      v.kind = value::type::boolean, v.boolean = true;
    } else if (literal("false")) {
      v.kind = value::type::boolean;
    } else if (literal("null")) {
      v.kind = value::type::null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = value::type::number;
      const std::size_t b = i_;
      while (i_ < s_.size() && (std::string_view("+-.eE").find(s_[i_]) != std::string_view::npos ||
                                (s_[i_] >= '0' && s_[i_] <= '9')))
        ++i_;
      v.text = std::string(s_.substr(b, i_ - b));
      double d;
      auto [p, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), d);
      if (ec != std::errc{} || p != v.text.data() + v.text.size()) fail("malformed number '" + v.text + "'");
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad hex digit in a \\u escape");
    }
    return u;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated string");
      switch (s_[i_++]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape in a string");
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};
}  // namespace detail

/// Parses text as one JSON value. Throws: loom::io::json::parse_error naming the byte.
inline value parse(std::string_view text) { return detail::parser(text).document(); }

/// s as a JSON string literal, quotes included.
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (u < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00", out += hex[u >> 4], out += hex[u & 15];
    } else out += c;
  }
  return out + "\"";
}

}  // namespace loom::io::json
