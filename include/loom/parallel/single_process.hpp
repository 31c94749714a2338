// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::single_process: the default policy, one process training alone, and its gradient
// communication for loom::replica_engine — the interface of gradient_allreduce with nothing to
// communicate.

#include <cstddef>
#include <string>
#include <vector>

#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom {

/// The default policy: one process trains alone.
struct single_process {};

/// replica_engine's gradient communication when training alone: none.
template <class Network, class T>
class single_process_sync {
 public:
  using rank_network = Network;
  int rank() const { return 0; }
  int world() const { return 1; }
  int replica() const { return 0; }
  int replicas() const { return 1; }
  template <std::size_t = 0>
  static constexpr auto pieces_of = shards::whole<Network>;
  shard_map shard() const {
    return {.whole_count = Network::parameter_count, .local_count = Network::parameter_count,
            .pieces = shards::whole<Network>};
  }
  void check_same_job(const std::string&) {}
  void broadcast_parameters(T*, std::size_t) {}
  void layer_done(std::size_t, T*) {}
  void finish(T*) {}
  void sum(double*, std::size_t) {}
  rank_figures& figures() { return figures_; }
  std::vector<rank_figures> gather_figures() { return {figures_}; }
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t, std::vector<std::size_t>& dropped) {
    dropped = {t.dropped()};
    return {t.events()};
  }

 private:
  rank_figures figures_;
};

}  // namespace loom
