// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of data_parallel.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/parallel/data_parallel.hpp"

namespace loom::detail {

LOOM_DECL std::string job_field_diff(const std::string& a, const std::string& b) {
  struct field {
    std::string key, text;
  };
  auto fields = [](const std::string& s) {
    std::vector<field> out;
    std::size_t at = 0;
    while (at <= s.size()) {
      std::size_t end = s.find(';', at);
      if (end == std::string::npos) end = s.size();
      if (end > at) {
        const std::string text = s.substr(at, end - at);
        out.push_back({text.substr(0, text.find('=')), text});
      }
      at = end + 1;
    }
    return out;
  };
  auto find = [](const std::vector<field>& fs, const std::string& key) -> const field* {
    for (const auto& f : fs)
      if (f.key == key) return &f;
    return nullptr;
  };
  const auto fa = fields(a), fb = fields(b);
  std::string out;
  for (const auto& x : fa) {
    const field* y = find(fb, x.key);
    if (!y || y->text != x.text) out += " [" + (y ? y->text : x.key + "=(none)") + "] where rank 0 has [" + x.text + "]";
  }
  for (const auto& y : fb)
    if (!find(fa, y.key)) out += " [" + y.text + "] where rank 0 has [" + y.key + "=(none)]";
  return out;
}

}  // namespace loom::detail
