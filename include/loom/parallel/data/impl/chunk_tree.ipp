// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of chunk_tree.hpp's non-template functions: included at the end of the
// header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/parallel/data/chunk_tree.hpp"

namespace loom {

LOOM_DECL void chunk_plan::offset_mismatch(std::size_t r, std::size_t global_n, std::size_t offset) const {
  throw invalid_argument("loom::trainer::fit: deterministic mode: replica " + std::to_string(r) + " of " +
                         std::to_string(ranks) + " expected the samples from " +
                         std::to_string(chunks_of(r, global_n).first * chunk) + " of the global batch, found them from " +
                         std::to_string(offset) + " (the loader does not deal as the chunk plan says)");
}

LOOM_DECL void chunk_plan::refuse(std::size_t chunk, bool compressed) {
  if (compressed)
    throw invalid_argument("loom::trainer::fit: deterministic_chunk=" + std::to_string(chunk) +
                           " sums each gradient in one fixed order of float additions, and loom::compress<> "
                           "rounds sums to 16 bits: they do not go together; set deterministic_chunk = 0 or drop "
                           "compress<> from data_parallel");
  throw invalid_argument("loom::trainer::fit: deterministic_chunk=" + std::to_string(chunk) +
                         " needs loom::single_process or loom::data_parallel<Comm, ...>, not this policy "
                         "(tensor or pipeline parallelism): set deterministic_chunk = 0");
}

LOOM_DECL chunk_plan chunk_plan::make(std::size_t batch, std::size_t chunk, std::size_t ranks) {
  const std::string where = "loom::trainer::fit: deterministic_chunk=" + std::to_string(chunk) + " with batch=" +
                            std::to_string(batch) + " on " + std::to_string(ranks) + " rank" +
                            (ranks == 1 ? "" : "s") + ": ";
  if (chunk == 0 || batch == 0)
    throw invalid_argument(where + "expected a chunk and a batch of at least 1 sample (0 turns the mode off)");
  if (ranks == 0) throw invalid_argument(where + "expected at least 1 rank, found 0");
  chunk_plan p;
  p.batch = batch;
  p.chunk = chunk;
  p.ranks = ranks;
  p.chunks_per_batch = (batch + chunk - 1) / chunk;
  p.chunks_per_rank = (p.chunks_per_batch + ranks - 1) / ranks;
  if (p.chunks_per_batch < ranks) {
    const std::size_t idle = ranks - p.chunks_per_batch;
    throw invalid_argument(where + "a full batch makes " + std::to_string(p.chunks_per_batch) + " chunk" +
                           (p.chunks_per_batch == 1 ? "" : "s") + " of at most " + std::to_string(chunk) +
                           " samples, which leaves " + std::to_string(idle) + " rank" + (idle == 1 ? "" : "s") +
                           " without samples in every step: expected at least one chunk per rank; use a chunk of "
                           "at most " + std::to_string(std::max<std::size_t>(1, batch / ranks)) +
                           " samples (batch / ranks), or fewer ranks");
  }
  return p;
}

LOOM_DECL std::vector<tree_node> aligned_subtrees(std::size_t first, std::size_t last) {
  std::vector<tree_node> out;
  for (std::size_t at = first; at < last;) {
    std::size_t size = std::bit_floor(last - at);
    if (at != 0) size = std::min(size, at & (~at + 1));  // the lowest set bit: at's alignment
    out.push_back({at, size});
    at += size;
  }
  return out;
}

}  // namespace loom
