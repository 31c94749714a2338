// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of collectives.hpp's non-template functions: included at the end of the
// header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/parallel/collectives.hpp"

namespace loom {

LOOM_DECL std::vector<std::string> collectives::allgather_text(const std::string& mine) {
  std::uint64_t width = mine.size() + 1;
  max(&width, 1);
  std::vector<char> in(width, '\0'), all(width * static_cast<std::size_t>(size()), '\0');
  std::memcpy(in.data(), mine.data(), mine.size());
  allgather(in.data(), all.data(), width);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r) out.emplace_back(all.data() + width * static_cast<std::size_t>(r));
  return out;
}

LOOM_DECL std::string collectives::agree_on_errors(const std::string& mine) {
  std::uint64_t any = mine.empty() ? 0 : 1;
  max(&any, 1);
  if (!any) return {};
  const auto all = allgather_text(mine);
  if (size() == 1) return all[0];
  std::string out;
  for (int r = 0; r < size(); ++r)
    if (!all[static_cast<std::size_t>(r)].empty())
      out += (out.empty() ? "" : "\n") + std::string("rank ") + std::to_string(r) + ": " + all[static_cast<std::size_t>(r)];
  return out;
}

}  // namespace loom
