// SPDX-License-Identifier: Apache-2.0
#pragma once
// The split-invariant mode's micro-step (trainer_options / fit_options::deterministic_chunk)
// around a network's passes: written once per element type, backend and communicator, not once
// per network. replica_passes hands it the network's passes over one chunk (chunk_passes).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/nn/loss.hpp"
#include "loom/parallel/data/chunk_tree.hpp"
#include "loom/parallel/engine.hpp"

namespace loom::detail {

/// A network's passes over one chunk of samples, for chunked_steps: forward and loss (the loss
/// gradient scaled as the engine's micro-step does), then backward, writing the gradients.
template <class T>
struct chunk_passes {
  virtual loss_value forward_loss(const T* x, const std::int32_t* labels, std::size_t k, std::size_t sample_offset) = 0;
  virtual void backward(std::size_t k) = 0;

 protected:
  ~chunk_passes() = default;
};

/// The buffers and trees of the split-invariant mode, and its micro-step.
template <class T, class Backend>
class chunked_steps {
  using space = typename Backend::memory_space;

 public:
  /// One micro-step (m of group) of plan on this rank's part b of the global batch: each chunk
  /// of b is copied into one buffer and run alone by `passes` (so it is computed alike on any
  /// rank), its gradients (grads, count values) pushed into the chunk tree from this rank's
  /// first chunk; the tree's sum is finished across the replicas by chunk_exchange over *comm
  /// (Comm void, or replicas 1: this rank holds every chunk), then summed over the group's
  /// micro-steps into grads on the last. Times compute and communication into fig.
  template <class Comm>
  loss_value step(const chunk_plan& plan, const batch_view<T>& b, std::size_t m, std::size_t group, Comm* comm,
                  std::size_t replica, std::size_t replicas, T* grads, std::size_t count, std::size_t in_width,
                  rank_figures& fig, chunk_passes<T>& passes);

  chunked_steps() = default;
  chunked_steps(chunked_steps&&) noexcept = default;
  chunked_steps& operator=(chunked_steps&&) noexcept = default;
  ~chunked_steps();  // out of line (below), so that the library's instantiation serves

  /// After a recovery from a failed rank: lets go of the trees' and the exchange's buffers,
  /// which operations in flight on the old communicator may still write.
  void abandon() noexcept {
    chunk_tree_.abandon();
    exchange_.abandon();
  }

 private:
  buffer<T, space> x_chunk_;
  buffer<std::int32_t, space> labels_chunk_;
  gradient_tree<T, Backend> chunk_tree_, step_tree_;
  chunk_exchange<T, Backend> exchange_;
};

template <class T, class Backend>
chunked_steps<T, Backend>::~chunked_steps() = default;

// Out of the class, so not inline: with loom::compiled a program calls the library's
// (chunked_steps<float, cpu>; over mpi_comm with loom::compiled_mpi).
template <class T, class Backend>
template <class Comm>
loss_value chunked_steps<T, Backend>::step(const chunk_plan& plan, const batch_view<T>& b, std::size_t m,
                                           std::size_t group, Comm* comm, std::size_t replica, std::size_t replicas,
                                           T* grads, std::size_t count, std::size_t in_width, rank_figures& fig,
                                           chunk_passes<T>& passes) {
  const std::size_t c = plan.chunk;
  monitor::timed compute(fig, &rank_figures::compute_s);
  x_chunk_.reserve_discard(c * in_width);
  labels_chunk_.reserve_discard(c);
  if (m == 0) step_tree_.reset(count);
  plan.check_offset(replica, b.global_n, b.n, b.offset);
  chunk_tree_.reset(count, plan.chunks_of(replica, b.global_n).first);
  loss_value v;
  for (std::size_t at = 0; at < b.n; at += c) {
    // (k, input) from one buffer for every chunk, so each chunk is computed alike on any rank.
    const std::size_t k = std::min(c, b.n - at);
    Backend::copy(x_chunk_.data(), b.x + at * in_width, k * in_width);
    Backend::copy(labels_chunk_.data(), b.labels + at, k);
    monitor::span fw(monitor::span_kind::forward);
    const loss_value u = passes.forward_loss(x_chunk_.data(), labels_chunk_.data(), k, b.offset + at);
    fw.stop();
    v.sum += u.sum;
    v.correct += u.correct;
    monitor::span bw(monitor::span_kind::backward);
    passes.backward(k);
    bw.stop();
    chunk_tree_.push(grads);
  }
  const bool alone = std::is_void_v<Comm> || replicas == 1;
  if (alone) chunk_tree_.fold(grads);  // the root: this rank holds every chunk
  compute.stop();
  if constexpr (!std::is_void_v<Comm>) {
    if (!alone) {
      monitor::timed exchange(fig, &rank_figures::comm_s);
      const double sent = exchange_.run(*comm, plan, b.global_n, chunk_tree_, grads, count);
      fig.bytes_sent += sent;
      fig.bus_bytes += sent;
      fig.comm_bytes += static_cast<double>(count * sizeof(T));
      fig.comm_exposed_s += exchange.stop();
    }
  }
  if (group > 1) {
    monitor::timed fold(fig, &rank_figures::compute_s);
    step_tree_.push(grads);
    if (m + 1 == group) step_tree_.fold(grads);
  }
  return v;
}

}  // namespace loom::detail
