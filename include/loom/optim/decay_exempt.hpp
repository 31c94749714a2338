// SPDX-License-Identifier: Apache-2.0
#pragma once
// The ranges of an optimizer state that get no weight decay (sgd / adam / adamw's option
// decay_norm_and_bias = false: torchvision's --norm-weight-decay 0 --bias-weight-decay 0). The
// state holds them in its own element offsets; whoever knows the network's layout and what the
// rank holds of it gives them (loom::trainer: detail::state_decay_exempt in
// loom/train/decay_exempt.hpp). Here only the ranges and the cutting of a step into runs.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/core/error.hpp"

namespace loom {

/// A half-open range [begin, end) of flat offsets.
struct index_range {
  std::size_t begin = 0, end = 0;
  friend constexpr bool operator==(const index_range&, const index_range&) = default;
};

namespace detail {

/// Sorted, merged ranges exempt from weight decay, and whether anyone gave them.
class decay_exemption {
 public:
  /// Takes `ranges` (any order, may touch or overlap): sorted and merged here.
  void set(std::vector<index_range> ranges) {
    std::sort(ranges.begin(), ranges.end(), [](const index_range& a, const index_range& b) { return a.begin < b.begin; });
    ranges_.clear();
    for (const index_range& r : ranges) {
      if (r.end <= r.begin) continue;
      if (!ranges_.empty() && r.begin <= ranges_.back().end) ranges_.back().end = std::max(ranges_.back().end, r.end);
      else ranges_.push_back(r);
    }
    given_ = true;
  }
  bool given() const noexcept { return given_; }
  const std::vector<index_range>& ranges() const noexcept { return ranges_; }

  /// Cuts [offset, offset + n) into consecutive runs, calling f(from, count, decay) with `from`
  /// relative to offset, in order; decay is false on the exempt runs.
  template <class F>
  void for_each_run(std::size_t offset, std::size_t n, F&& f) const {
    const std::size_t end = offset + n;
    std::size_t at = offset;
    auto r = std::upper_bound(ranges_.begin(), ranges_.end(), offset,
                              [](std::size_t v, const index_range& x) { return v < x.end; });
    for (; r != ranges_.end() && r->begin < end; ++r) {
      const std::size_t b = std::max(r->begin, at), e = std::min(r->end, end);
      if (b > at) f(at - offset, b - at, true);
      if (e > b) f(b - offset, e - b, false);
      at = e;
    }
    if (at < end) f(at - offset, end - at, true);
  }

 private:
  std::vector<index_range> ranges_;
  bool given_ = false;
};

/// decay_norm_and_bias = false with weight decay on, and nobody said which values are the norm
/// layers' and the biases': the step would decay them silently, so it refuses.
[[noreturn]] inline void throw_no_decay_exemption(const char* who) {
  throw invalid_argument(std::string(who) +
                         ": option decay_norm_and_bias = false needs the network's layout to know which values are "
                         "normalization parameters and biases; loom::trainer gives it (set_decay_exempt): a state "
                         "stepped on its own must be given it too, or keep decay_norm_and_bias = true");
}

}  // namespace detail

}  // namespace loom
