// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the local and the mpirun tests of loom::chunk_exchange share: made-up chunk gradients
// whose sums depend on the order of their additions, the one-rank tree sum they must equal bit
// for bit, and one rank's part of an exchange over any communicator.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/parallel/data/chunk_tree.hpp"

namespace loom_test {

/// Chunk k's gradient, n values: magnitudes from 2^-20 to 2^20 and both signs, so that float
/// sums of them round differently in different orders.
inline std::vector<float> chunk_gradient(std::size_t k, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t h = (static_cast<std::uint64_t>(k) << 32 | i) + 0x9e3779b97f4a7c15ull;  // splitmix64
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    const int e = static_cast<int>(h >> 58) % 41 - 20;
    const float m = 1.0f + static_cast<float>((h >> 20) & 0xffff) / 65536.0f;
    g[i] = std::ldexp((h & 1) ? -m : m, e);
  }
  return g;
}

/// The canonical tree's root over chunks [0, chunks) on one rank: one gradient_tree.
inline std::vector<float> one_rank_root(std::size_t chunks, std::size_t n) {
  loom::gradient_tree<float, loom::cpu> t;
  t.reset(n);
  for (std::size_t k = 0; k < chunks; ++k) t.push(chunk_gradient(k, n).data());
  std::vector<float> out(n);
  t.fold(out.data());
  return out;
}

/// The sum of chunks [0, chunks) from left to right, which the tree must differ from somewhere
/// when chunks >= 4 (else a test could not tell orders apart; up to 3 chunks the two agree).
inline std::vector<float> running_sum(std::size_t chunks, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  for (std::size_t k = 0; k < chunks; ++k) {
    const auto g = chunk_gradient(k, n);
    for (std::size_t i = 0; i < n; ++i) out[i] = k == 0 ? g[i] : out[i] + g[i];
  }
  return out;
}

/// This rank's part of the exchange of a global batch of global_n samples under `plan`: pushes
/// its chunks into `mine` and returns the root the exchange gives it (n values); *sent gets
/// the bytes it sent. Collective over comm.
template <class Comm>
std::vector<float> exchanged(Comm& comm, const loom::chunk_plan& plan, std::size_t global_n, std::size_t n,
                             loom::gradient_tree<float, loom::cpu>& mine, loom::chunk_exchange<float, loom::cpu>& ex,
                             double* sent = nullptr) {
  const auto [first, last] = plan.chunks_of(static_cast<std::size_t>(comm.rank()), global_n);
  mine.reset(n, first);
  for (std::size_t k = first; k < last; ++k) mine.push(chunk_gradient(k, n).data());
  std::vector<float> out(n, -1.0f);
  const double s = ex.run(comm, plan, global_n, mine, out.data(), n);
  if (sent) *sent = s;
  return out;
}

}  // namespace loom_test
