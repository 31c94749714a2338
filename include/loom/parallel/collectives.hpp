// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::collectives: the few world-wide operations the trainer's checkpoints, preemption and
// resume need, behind one non-template interface, so that their code is compiled once per
// program rather than once per trainer type. comm_collectives<Comm> wraps an engine's world
// communicator (engine.world_comm()); solo_collectives stands for a rank training alone.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/config.hpp"

namespace loom {

/// World-wide operations over every rank of a trainer (see the file comment).
class collectives {
 public:
  virtual ~collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// v[0, n) becomes the element-wise maximum over the ranks.
  virtual void max(std::uint64_t* v, std::size_t n) = 0;
  /// Every rank's n bytes, in rank order, into all (size() * n bytes).
  virtual void allgather(const char* mine, char* all, std::size_t n) = 0;
  /// Point-to-point float messages (blocking; MPI's ordering between a pair of ranks).
  virtual void send(const float* p, std::size_t n, int to, int tag) = 0;
  virtual void recv(float* p, std::size_t n, int from, int tag) = 0;

  /// Every rank's text, in rank order. Collective.
  LOOM_DECL std::vector<std::string> allgather_text(const std::string& mine);
  /// The ranks' non-empty texts as one message ("rank r: text", one per line; the text alone
  /// when training alone), or empty when every rank's is. Collective: every rank gets the same.
  LOOM_DECL std::string agree_on_errors(const std::string& mine);
};

/// A rank training alone.
class solo_collectives final : public collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void max(std::uint64_t*, std::size_t) override {}
  void allgather(const char* mine, char* all, std::size_t n) override { std::memcpy(all, mine, n); }
  void send(const float*, std::size_t, int, int) override {}
  void recv(float*, std::size_t, int, int) override {}
};

/// The world communicator of an engine (kept by reference: it must outlive this).
template <class Comm>
class comm_collectives final : public collectives {
 public:
  explicit comm_collectives(Comm& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void max(std::uint64_t* v, std::size_t n) override { c_.allreduce(v, n, reduce_op::max); }
  void allgather(const char* mine, char* all, std::size_t n) override { c_.allgather(mine, all, n); }
  void send(const float* p, std::size_t n, int to, int tag) override { c_.send(p, n, to, tag); }
  void recv(float* p, std::size_t n, int from, int tag) override { c_.recv(p, n, from, tag); }

 private:
  Comm& c_;
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/parallel/impl/collectives.ipp"
#endif
