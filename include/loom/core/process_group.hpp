// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::process_group: the ranks a layer communicates over inside its forward and backward, as
// the engine hands them down through the run context (ARCHITECTURE.md, rule 8): the
// tensor-parallel group of a split linear layer, the data-parallel replicas of a batch norm
// whose statistics are summed over the global batch. An interface, so that layers and backends
// need no communicator type; the engines implement it over theirs. No communication here.

#include <cstddef>

namespace loom {

/// Ranks that sum values together. Implemented by an engine over its communicator.
struct process_group {
  virtual ~process_group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sums data[0, n) over the group's ranks, in place (collective over the group). The memory
  /// is the backend's (device memory on a GPU: the group's communicator must move it).
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  virtual void allreduce_sum(double* data, std::size_t n) = 0;
};

}  // namespace loom
