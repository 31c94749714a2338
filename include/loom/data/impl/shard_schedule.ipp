// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of shard_schedule.hpp's functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include <algorithm>
#include <numeric>

#include "loom/core/random.hpp"
#include "loom/data/shard_schedule.hpp"

namespace loom::data {
namespace detail {

LOOM_DECL std::vector<std::size_t> stream_tie_order(std::size_t streams) {
  std::size_t bits = 0;
  while ((std::size_t{1} << bits) < streams) ++bits;
  const auto reversed = [bits](std::size_t v) {
    std::size_t r = 0;
    for (std::size_t b = 0; b < bits; ++b) r |= ((v >> b) & 1) << (bits - 1 - b);
    return r;
  };
  std::vector<std::size_t> order(streams);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return reversed(a) < reversed(b); });
  return order;
}

LOOM_DECL stream_layout deal_shards(std::span<const std::uint64_t> counts, std::size_t streams, std::uint64_t seed,
                                    std::uint64_t epoch, bool shuffle) {
  std::vector<std::uint32_t> order(counts.size());
  std::iota(order.begin(), order.end(), std::uint32_t{0});
  if (shuffle && order.size() > 1) {
    splitmix64 gen(counter_hash(seed, shard_order_stream, epoch));
    for (std::size_t i = order.size() - 1; i > 0; --i) {
      const auto j = static_cast<std::size_t>(gen.below(static_cast<std::uint64_t>(i) + 1));
      std::swap(order[i], order[j]);
    }
  }
  // rank_of[v]: stream v's place in the tie order.
  const std::vector<std::size_t> ties = stream_tie_order(streams);
  std::vector<std::size_t> rank_of(streams);
  for (std::size_t i = 0; i < streams; ++i) rank_of[ties[i]] = i;
  stream_layout out;
  out.shards.resize(streams);
  out.starts.assign(streams, std::vector<std::uint64_t>{0});
  out.samples.assign(streams, 0);
  for (std::uint32_t s : order) {
    std::size_t best = 0;
    for (std::size_t v = 1; v < streams; ++v)
      if (out.samples[v] < out.samples[best] || (out.samples[v] == out.samples[best] && rank_of[v] < rank_of[best]))
        best = v;
    out.shards[best].push_back(s);
    out.samples[best] += counts[s];
    out.starts[best].push_back(out.samples[best]);
  }
  return out;
}

LOOM_DECL bool batch_split::before(std::size_t a, std::size_t b) const noexcept {
  // a's priority n_a / (2 t_a + 1) above b's, ties to the lower stream.
  // The products reach 2^65 and more with a billion samples: compare them in 128 bits.
  __extension__ using wide = unsigned __int128;
  const wide pa = static_cast<wide>(n_[a]) * (2 * taken_[b] + 1);
  const wide pb = static_cast<wide>(n_[b]) * (2 * taken_[a] + 1);
  return pa > pb || (pa == pb && a < b);
}

LOOM_DECL void batch_split::reset(std::span<const std::uint64_t> samples) {
  n_.assign(samples.begin(), samples.end());
  taken_.assign(n_.size(), 0);
  seats_ = 0;
  total_ = 0;
  heap_.clear();
  for (std::size_t v = 0; v < n_.size(); ++v) {
    total_ += n_[v];
    if (n_[v] > 0) heap_.push_back(v);
  }
  // A max-heap by priority: std::make_heap keeps the "largest" first under a less-than.
  std::make_heap(heap_.begin(), heap_.end(), [this](std::size_t a, std::size_t b) { return before(b, a); });
}

LOOM_DECL void batch_split::advance_to(std::uint64_t seat) {
  const auto less = [this](std::size_t a, std::size_t b) { return before(b, a); };
  seat = std::min(seat, total_);
  while (seats_ < seat) {
    std::pop_heap(heap_.begin(), heap_.end(), less);
    const std::size_t v = heap_.back();
    ++taken_[v];
    ++seats_;
    if (taken_[v] < n_[v]) std::push_heap(heap_.begin(), heap_.end(), less);
    else heap_.pop_back();
  }
}

LOOM_DECL shard_schedule::shard_schedule(std::vector<std::uint64_t> counts, std::size_t streams, std::size_t window,
                                         std::size_t batch, std::uint64_t seed, bool shuffle)
    : counts_(std::move(counts)),
      streams_(streams),
      window_(std::max<std::size_t>(1, shuffle ? window : 1)),
      batch_(batch),
      seed_(seed),
      shuffle_(shuffle) {
  first_.resize(counts_.size());
  for (std::size_t s = 0; s < counts_.size(); ++s) {
    first_[s] = total_;
    total_ += counts_[s];
  }
}

LOOM_DECL void shard_schedule::set_epoch(std::size_t e) {
  if (e == epoch_) return;
  epoch_ = e;
  layout_ = deal_shards(counts_, streams_, seed_, e, shuffle_);
  split_.reset(layout_.samples);
  split_step_ = 0;
  perm_window_.assign(streams_, static_cast<std::uint64_t>(-1));
  perm_.assign(streams_, {});
}

LOOM_DECL void shard_schedule::step_ranges(std::size_t k, std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) {
  if (k < split_step_) {
    split_.reset(layout_.samples);
    split_step_ = 0;
  }
  split_.advance_to(static_cast<std::uint64_t>(k) * batch_);
  out.resize(streams_);
  for (std::size_t v = 0; v < streams_; ++v) out[v].first = split_.taken()[v];
  split_.advance_to(static_cast<std::uint64_t>(k + 1) * batch_);
  for (std::size_t v = 0; v < streams_; ++v) out[v].second = split_.taken()[v];
  split_step_ = k + 1;
}

LOOM_DECL std::uint64_t shard_schedule::sample_at(std::size_t v, std::uint64_t p) {
  if (window_ == 1) return p;
  const std::uint64_t w = p / window_, base = w * window_;
  if (perm_window_[v] != w) {
    const std::uint64_t len = std::min<std::uint64_t>(window_, layout_.samples[v] - base);
    std::vector<std::uint32_t>& perm = perm_[v];
    perm.resize(static_cast<std::size_t>(len));
    std::iota(perm.begin(), perm.end(), std::uint32_t{0});
    const std::uint64_t key =
        counter_hash(counter_hash(seed_, window_order_stream, static_cast<std::uint64_t>(epoch_)), v, w);
    splitmix64 gen(key);
    for (std::size_t i = perm.size(); i-- > 1;) {
      const auto j = static_cast<std::size_t>(gen.below(static_cast<std::uint64_t>(i) + 1));
      std::swap(perm[i], perm[j]);
    }
    perm_window_[v] = w;
  }
  return base + perm_[v][static_cast<std::size_t>(p - base)];
}

LOOM_DECL shard_schedule::place shard_schedule::locate(std::size_t v, std::uint64_t q) const {
  const std::vector<std::uint64_t>& starts = layout_.starts[v];
  // The last shard whose first sample is at or before q (shards of 0 samples are passed over).
  const auto it = std::upper_bound(starts.begin(), starts.end() - 1, q);
  const auto slot = static_cast<std::size_t>(it - starts.begin()) - 1;
  return {slot, layout_.shards[v][slot], q - starts[slot]};
}

LOOM_DECL std::string describe_sample(const shard_manifest& m, const fetched_sample& f) {
  return shard_prefix(m.shards[f.shard].path) + "member " + f.member + " at byte " + std::to_string(f.offset);
}

LOOM_DECL fetched_sample stream_reader::take(shard_schedule& s, std::size_t v, std::uint64_t q, bool want_image) {
  const std::uint64_t k = s.window(), w = q / k;
  if (w != window_ || (want_image && !window_images_)) {
    samples_.clear();
    const std::uint64_t base = w * k, end = std::min<std::uint64_t>(base + k, s.layout().samples[v]);
    samples_.reserve(static_cast<std::size_t>(end - base));
    for (std::uint64_t i = base; i < end; ++i) samples_.push_back(read(s, v, i, want_image));
    window_ = w;
    window_images_ = want_image;
  }
  return std::move(samples_[static_cast<std::size_t>(q - w * k)]);
}

LOOM_DECL fetched_sample stream_reader::read(shard_schedule& s, std::size_t v, std::uint64_t q, bool want_image) {
  const shard_schedule::place at = s.locate(v, q);
  const shard_info& info = manifest_->shards[at.shard];
  fetched_sample out;
  out.index = s.first_index(at.shard) + at.member;
  // Move the cursor to the shard and member: forward when it is there already, else from the
  // shard's start.
  if (at.slot != slot_ || !reader_ || at.member < next_member_) {
    close();
    slot_ = at.slot;
    shard_ = at.shard;
    next_member_ = 0;
    try {
      reader_.emplace(info.path, classes_, read_size_);
    } catch (const io_error& e) {
      broken_ = e.what();
      broken_kind_ = sample_problem::unreadable_shard;
    }
  }
  tar_sample ts;
  while (broken_.empty() && next_member_ <= at.member) {
    try {
      const bool keep = next_member_ == at.member;
      if (!reader_->next(ts, keep && want_image)) {
        broken_ = shard_prefix(info.path) + "ends after " + std::to_string(next_member_) + " samples (" +
                  std::to_string(reader_->reader().file_size()) + " bytes), but its manifest says it holds " +
                  std::to_string(info.samples) + ": the shard is cut short or changed since the manifest was written";
        broken_kind_ = sample_problem::damaged_shard;
        break;
      }
    } catch (const data_error& e) {
      broken_ = e.what();
      broken_kind_ = sample_problem::damaged_shard;
      break;
    } catch (const io_error& e) {
      broken_ = e.what();
      broken_kind_ = sample_problem::unreadable_shard;
      break;
    }
    ++next_member_;
  }
  out.shard = at.shard;
  if (!broken_.empty()) {
    out.problem = broken_ + " (sample " + std::to_string(at.member) + " of the shard cannot be read)";
    out.kind = broken_kind_;
    return out;
  }
  out.member = std::move(ts.image_member.empty() ? ts.key : ts.image_member);
  out.offset = ts.image_member.empty() ? ts.offset : ts.image_offset;
  out.problem = std::move(ts.problem);
  out.kind = ts.kind;
  out.label = static_cast<std::int32_t>(ts.label);
  out.image = std::move(ts.image);
  return out;
}

}  // namespace detail
}  // namespace loom::data
