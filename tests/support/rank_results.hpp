// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every rank of a loom::local_world found, by rank, for the test's own thread to check:
// Catch2's macros are not thread-safe, so the ranks' threads only record, never assert (called
// from them, the macros corrupted Catch2's heap now and then). Not for MPI tests, whose ranks
// are processes that check on their main thread.

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "loom/comm/local.hpp"

namespace loom::testing {

/// Runs f(comm) on every rank of a local_world of n and returns what f returned on each, by
/// rank. f runs on n threads at once: it must not call Catch2. An exception thrown on a rank
/// is rethrown here (local_world::run).
template <class F>
  requires std::invocable<F&, loom::local_comm&>
auto on_local_ranks(int n, F&& f) {
  std::vector<std::invoke_result_t<F&, loom::local_comm&>> found(static_cast<std::size_t>(n));
  loom::local_world(n).run([&](loom::local_comm& c) { found[static_cast<std::size_t>(c.rank())] = f(c); });
  return found;
}

}  // namespace loom::testing
