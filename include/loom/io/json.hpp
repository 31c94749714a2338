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

#include "loom/core/config.hpp"
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

  value document();

 private:
  static constexpr int max_depth = 64;

  [[noreturn]] void fail(const std::string& why) const;
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

  value parse(int depth);

  unsigned hex4();
  static void utf8(std::string& out, unsigned cp);
  std::string string();

  std::string_view s_;
  std::size_t i_ = 0;
};
}  // namespace detail

/// Parses text as one JSON value. Throws: loom::io::json::parse_error naming the byte.
LOOM_DECL value parse(std::string_view text);

/// s as a JSON string literal, quotes included.
LOOM_DECL std::string quote(std::string_view s);

}  // namespace loom::io::json

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/json.ipp"
#endif
