// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of json.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/io/json.hpp"

namespace loom::io::json {
namespace detail {

LOOM_DECL value parser::document() {
  value v = parse(0);
  skip_space();
  if (i_ != s_.size()) fail("text after the end of the JSON value");
  return v;
}

LOOM_DECL void parser::fail(const std::string& why) const {
  throw parse_error(why + " at byte " + std::to_string(i_));
}

LOOM_DECL value parser::parse(int depth) {
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

LOOM_DECL unsigned parser::hex4() {
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

LOOM_DECL void parser::utf8(std::string& out, unsigned cp) {
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

LOOM_DECL std::string parser::string() {
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
}  // namespace detail
}  // namespace loom::io::json

namespace loom::io::json {

LOOM_DECL value parse(std::string_view text) { return detail::parser(text).document(); }

LOOM_DECL std::string quote(std::string_view s) {
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
