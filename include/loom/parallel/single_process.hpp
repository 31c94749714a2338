// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::single_process: the default policy, one process training alone, and its engine — the
// same interface as data_parallel_engine with nothing to communicate.

#include <cstddef>
#include <string>
#include <vector>

#include "loom/parallel/figures.hpp"

namespace loom {

/// The default policy: one process trains alone.
struct single_process {};

template <class Network, class T>
class single_process_engine {
 public:
  int rank() const { return 0; }
  int world() const { return 1; }
  void check_same_job(const std::string&) {}
  void broadcast_parameters(T*, std::size_t) {}
  void layer_done(std::size_t, T*) {}
  void finish(T*) {}
  void sum(double*, std::size_t) {}
  rank_figures& figures() { return figures_; }
  std::vector<rank_figures> gather_figures() { return {figures_}; }

 private:
  rank_figures figures_;
};

}  // namespace loom
