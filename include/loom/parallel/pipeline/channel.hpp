// SPDX-License-Identifier: Apache-2.0
#pragma once
// The messages of one pipeline stage to its neighbours over the pipeline group
// (detail::stage_channel), each kind of bookkeeping written once: a training message's tag (its
// micro-batch and kind), its neighbour, its span in the timeline with its bytes, a send's bytes
// in the stage's figures; evaluation's messages and their tag; the waits for messages, counted
// as the stage's bubble time; and the host element that an empty message names. The stage that
// posts them is stage.hpp's detail::stage_runner.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::detail {

/// Stage `stage`'s channel to its neighbours: a view over the stage's pipeline communicator, its
/// figures and a host element, made for each use (stage_runner::channel()), so that it never
/// outlives what it points to. micro_batches: the schedule's, whose tags the training messages
/// take (2 m, 2 m + 1); evaluation's messages take the next one.
template <class T, class Comm>
struct stage_channel {
  using request = typename Comm::request;

  Comm& pipe;
  rank_figures& figures;
  T& empty;
  int stage;
  std::size_t micro_batches;

  /// Posts receive `op` (recv_activation, recv_gradient) of micro-batch m's count elements (n
  /// samples) into p.
  request receive(pipeline_op_kind op, T* p, std::size_t count, std::size_t n, std::size_t m) {
    return timed(op, count, m, [&](int peer, int tag) { return pipe.irecv(message(p, n), count, peer, tag); });
  }
  /// Posts send `op` (send_activation, send_gradient) of micro-batch m's count elements (n
  /// samples) from p.
  request send(pipeline_op_kind op, const T* p, std::size_t count, std::size_t n, std::size_t m) {
    return timed(op, count, m, [&](int peer, int tag) { return pipe.isend(message(p, n), count, peer, tag); });
  }

  /// Evaluation's forward-only messages: the previous stage's output of n samples into p, and
  /// this stage's out to the next.
  request receive_evaluation(T* p, std::size_t count, std::size_t n) {
    return pipe.irecv(message(p, n), count, stage - 1, evaluation_tag());
  }
  request send_evaluation(const T* p, std::size_t count, std::size_t n) {
    return pipe.isend(message(p, n), count, stage + 1, evaluation_tag());
  }

  /// Waits for one message, or for all of rs (then cleared): the stage's bubble time.
  void wait(request& r) {
    monitor::timed bubble(figures, &rank_figures::bubble_s);
    r.wait();
  }
  void wait_all(std::vector<request>& rs) {
    if (rs.empty()) return;
    monitor::timed bubble(figures, &rank_figures::bubble_s);
    for (auto& r : rs) r.wait();
    rs.clear();
  }

 private:
  /// Posts a training message through post(peer, tag) and records it: its span, with its bytes,
  /// and a send's bytes in the figures.
  template <class Post>
  request timed(pipeline_op_kind op, std::size_t count, std::size_t m, Post&& post) {
    const int peer = static_cast<int>(peer_of(op, static_cast<std::size_t>(stage)));
    const double bytes = static_cast<double>(count * sizeof(T));
    const auto posted = monitor::clock::now();
    request r = post(peer, tag_of(m, op));
    if (is_send(op)) figures.bytes_sent += bytes;
    monitor::record_span(is_send(op) ? monitor::span_kind::send : monitor::span_kind::receive, posted,
                         monitor::clock::now(), static_cast<std::int32_t>(m), peer, bytes);
    return r;
  }
  static int tag_of(std::size_t m, pipeline_op_kind k) {
    const bool gradient = k == pipeline_op_kind::send_gradient || k == pipeline_op_kind::recv_gradient;
    return static_cast<int>(2 * m + (gradient ? 1 : 0));
  }
  int evaluation_tag() const { return static_cast<int>(2 * micro_batches); }
  /// A pointer for a message of n elements: p, or host memory when there is nothing to send
  /// (both ends of an empty message then name host memory, which every communicator moves).
  const T* message(const T* p, std::size_t n) const { return p && n > 0 ? p : &empty; }
  T* message(T* p, std::size_t n) { return p && n > 0 ? p : &empty; }
};

}  // namespace loom::detail
