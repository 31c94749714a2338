// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::local_world and loom::local_comm: a communicator whose ranks are the threads of one
// process, for tests and one-process multi-worker runs. It is never the way across machines;
// that is loom::mpi_comm (loom/comm/mpi.hpp).

#include <algorithm>
#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom {

class local_comm;
class local_world;

namespace detail {

/// The name of an element type, for messages.
template <class T>
constexpr const char* local_type_name() noexcept {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, long double>) return "long double";
  else if constexpr (std::is_same_v<T, char>) return "char";
  else if constexpr (std::is_same_v<T, signed char>) return "signed char";
  else if constexpr (std::is_same_v<T, unsigned char>) return "unsigned char";
  else if constexpr (std::is_same_v<T, short>) return "short";
  else if constexpr (std::is_same_v<T, unsigned short>) return "unsigned short";
  else if constexpr (std::is_same_v<T, int>) return "int";
  else if constexpr (std::is_same_v<T, unsigned>) return "unsigned";
  else if constexpr (std::is_same_v<T, long>) return "long";
  else if constexpr (std::is_same_v<T, unsigned long>) return "unsigned long";
  else if constexpr (std::is_same_v<T, long long>) return "long long";
  else if constexpr (std::is_same_v<T, unsigned long long>) return "unsigned long long";
  else return "an arithmetic type";
}

/// One object per element type; its address tells types apart across ranks.
template <class T>
inline constexpr char local_type_tag = 0;

/// Bytes of one unit of collective work (one chunk), which any waiting rank may take.
inline constexpr std::size_t local_chunk_bytes = std::size_t{256} << 10;

template <class T>
constexpr std::size_t local_chunk_elements() noexcept {
  return std::max<std::size_t>(1, local_chunk_bytes / sizeof(T));
}

/// A rank blocked inside local_comm, registered so that the last rank to block can tell a
/// deadlock (every live rank waits and none can go on) from a wait that will end.
struct local_waiter {
  virtual bool ready() const = 0;          // would it stop waiting now? (mutex held)
  virtual std::string describe() const = 0;  // "rank 1 waits in recv from rank 0 (tag 2)"

 protected:
  ~local_waiter() = default;
};

/// What every rank and sub-group of one local_world::run shares: one mutex and condition
/// variable for all waits, the failure that ends the run, and which ranks have returned.
struct local_state {
  explicit local_state(int n) : exited(static_cast<std::size_t>(n), 0), waiting(static_cast<std::size_t>(n)),
                                errors(static_cast<std::size_t>(n)) {}

  std::mutex mutex;
  std::condition_variable cv;
  bool failed = false;
  int failed_rank = -1;  // the world rank that failed first; -1 for a deadlock
  std::string failed_what;
  std::vector<char> exited;                    // by world rank: its function has returned
  std::vector<const local_waiter*> waiting;    // by world rank: what it is blocked on
  std::vector<std::exception_ptr> errors;      // by world rank: what its function threw

  /// Marks the run failed (the first failure wins) and wakes every waiter. Mutex held.
  void fail(int world_rank, std::string what) {
    if (!failed) {
      failed = true;
      failed_rank = world_rank;
      failed_what = std::move(what);
    }
    cv.notify_all();
  }

  [[noreturn]] void throw_failed() const {
    if (failed_rank < 0) throw communication_error("local_comm: " + failed_what);
    throw communication_error("local_comm: rank " + std::to_string(failed_rank) + " failed: " + failed_what);
  }

  /// True (and the run failed) when every rank still running waits and none can go on. Mutex held.
  bool detect_deadlock() {
    std::string who;
    for (std::size_t r = 0; r < exited.size(); ++r) {
      if (exited[r]) continue;
      if (waiting[r] == nullptr || waiting[r]->ready()) return false;
      who += (who.empty() ? "" : "; ") + waiting[r]->describe();
    }
    if (who.empty()) return false;
    fail(-1, "deadlock: every rank waits and none can go on: " + who);
    return true;
  }

  /// Blocks once on the condition variable as `w`, unless that completes a deadlock.
  void block(std::unique_lock<std::mutex>& lock, int world_rank, const local_waiter& w) {
    waiting[static_cast<std::size_t>(world_rank)] = &w;
    if (!detect_deadlock()) cv.wait(lock);
    waiting[static_cast<std::size_t>(world_rank)] = nullptr;
  }
};

enum class local_kind { barrier, split, broadcast, allreduce, reduce_scatter, allgather, reduce_scatter_v, allgather_v };

constexpr const char* to_string(local_kind k) noexcept {
  switch (k) {
    case local_kind::barrier: return "barrier";
    case local_kind::split: return "split";
    case local_kind::broadcast: return "broadcast";
    case local_kind::allreduce: return "allreduce";
    case local_kind::reduce_scatter: return "reduce_scatter";
    case local_kind::allgather: return "allgather";
    case local_kind::reduce_scatter_v: return "ireduce_scatter_v";
    case local_kind::allgather_v: return "iallgather_v";
  }
  return "?";
}

struct local_collective;
using local_chunk_fn = void (*)(const local_collective&, std::size_t);

/// One rank's arguments to one collective.
struct local_args {
  local_kind kind = local_kind::barrier;
  const void* type = nullptr;
  const char* type_name = "";
  std::size_t count = 0;
  int root = 0;
  reduce_op op = reduce_op::sum;
  const void* in = nullptr;
  void* out = nullptr;
  int colour = 0;
  int key = 0;
  local_chunk_fn chunk = nullptr;
  std::size_t chunks = 0;
  bool posted = false;
  std::vector<std::size_t> counts;  // the v-collectives: block sizes by rank
};

struct local_group;

/// One collective call, the k-th on its communicator: each rank posts its arguments; once all
/// have, its work is cut into chunks that any rank waiting on it takes, so the copying and
/// reducing runs on all waiting threads. Every chunk reduces in rank order: results do not
/// depend on which thread ran it.
struct local_collective {
  local_collective(std::uint64_t sequence, int n) : seq(sequence), args(static_cast<std::size_t>(n)) {}

  std::uint64_t seq;
  std::vector<local_args> args;  // by group rank
  int posted = 0;
  std::string error;  // set once all have posted, when their arguments disagree
  local_chunk_fn chunk = nullptr;
  std::size_t chunks = 0, next = 0, done = 0, running = 0;
  bool aborted = false;  // no more chunks start (the run failed)
  std::vector<std::shared_ptr<local_group>> groups;  // split: by old rank, the new group
  std::vector<int> new_rank;                         // split: by old rank, the new rank

  int size() const noexcept { return static_cast<int>(args.size()); }
  bool complete() const noexcept { return posted == size() && done == chunks; }
};

/// One send or receive, waiting in a mailbox until its partner is posted.
struct local_message {
  bool is_send = false;
  int source = 0, dest = 0, tag = 0;  // group ranks
  const void* src = nullptr;          // send
  void* dst = nullptr;                // receive
  std::size_t count = 0, bytes = 0;
  const char* type_name = "";
  bool done = false;
  std::string error;  // receive: the message did not fit
};

/// Unmatched messages addressed to one rank of a group, oldest first.
struct local_mailbox {
  std::deque<std::shared_ptr<local_message>> sends;  // sent to this rank, not yet received
  std::deque<std::shared_ptr<local_message>> recvs;  // posted by this rank, not yet matched
};

/// One communicator: the world or a group made by split. Mutated only under local_state's mutex.
struct local_group {
  explicit local_group(std::vector<int> ranks)
      : world_ranks(std::move(ranks)), next_seq(world_ranks.size(), 0), mailbox(world_ranks.size()) {}

  std::vector<int> world_ranks;     // by group rank
  std::vector<std::uint64_t> next_seq;  // by group rank: collectives it has started
  std::map<std::uint64_t, std::shared_ptr<local_collective>> pending;  // started, not by all yet
  std::vector<local_mailbox> mailbox;   // by group rank

  int size() const noexcept { return static_cast<int>(world_ranks.size()); }
  int world(int r) const noexcept { return world_ranks[static_cast<std::size_t>(r)]; }
};

// --- chunk bodies: chunk k of a collective whose arguments all ranks agree on --------------

template <class T>
void local_broadcast_chunk(const local_collective& c, std::size_t k) {
  constexpr std::size_t len = local_chunk_elements<T>();
  const auto& a0 = c.args[0];
  const std::size_t lo = k * len, n = std::min(len, a0.count - lo);
  const T* src = static_cast<const T*>(c.args[static_cast<std::size_t>(a0.root)].in) + lo;
  for (int j = 0; j < c.size(); ++j)
    if (j != a0.root) std::memcpy(static_cast<T*>(c.args[static_cast<std::size_t>(j)].out) + lo, src, n * sizeof(T));
}

template <class T>
void local_reduce_into(T* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + x[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] < x[i] ? x[i] : acc[i];
  }
}

// In place: rank 0's buffer accumulates ranks 1, 2, ... in order, then is copied to the others.
template <class T>
void local_allreduce_chunk(const local_collective& c, std::size_t k) {
  constexpr std::size_t len = local_chunk_elements<T>();
  const auto& a0 = c.args[0];
  const std::size_t lo = k * len, n = std::min(len, a0.count - lo);
  T* acc = static_cast<T*>(a0.out) + lo;
  for (int j = 1; j < c.size(); ++j)
    local_reduce_into(acc, static_cast<const T*>(c.args[static_cast<std::size_t>(j)].in) + lo, n, a0.op);
  for (int j = 1; j < c.size(); ++j)
    std::memcpy(static_cast<T*>(c.args[static_cast<std::size_t>(j)].out) + lo, acc, n * sizeof(T));
}

// Chunk k: block b = k / per (the output of rank b), piece k % per of it.
template <class T>
void local_reduce_scatter_chunk(const local_collective& c, std::size_t k) {
  constexpr std::size_t len = local_chunk_elements<T>();
  const auto& a0 = c.args[0];
  const std::size_t per = (a0.count + len - 1) / len;
  const std::size_t b = k / per, lo = (k % per) * len, n = std::min(len, a0.count - lo);
  const std::size_t from = b * a0.count + lo;
  T* out = static_cast<T*>(c.args[b].out) + lo;
  std::memcpy(out, static_cast<const T*>(a0.in) + from, n * sizeof(T));
  for (int j = 1; j < c.size(); ++j)
    local_reduce_into(out, static_cast<const T*>(c.args[static_cast<std::size_t>(j)].in) + from, n, a0.op);
}

// Chunk k: the block of rank b = k / per, piece k % per of it, copied to every rank.
template <class T>
void local_allgather_chunk(const local_collective& c, std::size_t k) {
  constexpr std::size_t len = local_chunk_elements<T>();
  const auto& a0 = c.args[0];
  const std::size_t per = (a0.count + len - 1) / len;
  const std::size_t b = k / per, lo = (k % per) * len, n = std::min(len, a0.count - lo);
  const T* src = static_cast<const T*>(c.args[b].in) + lo;
  for (int j = 0; j < c.size(); ++j)
    std::memcpy(static_cast<T*>(c.args[static_cast<std::size_t>(j)].out) + b * a0.count + lo, src, n * sizeof(T));
}

// The v-collectives: chunk k is block k (of rank k), at the sum of the blocks before it.
inline std::size_t local_block_start(const local_args& a, std::size_t k) {
  std::size_t at = 0;
  for (std::size_t j = 0; j < k; ++j) at += a.counts[j];
  return at;
}
template <class T>
void local_reduce_scatter_v_chunk(const local_collective& c, std::size_t k) {
  const auto& a0 = c.args[0];
  const std::size_t from = local_block_start(a0, k), n = a0.counts[k];
  if (n == 0) return;
  T* out = static_cast<T*>(c.args[k].out);
  std::memcpy(out, static_cast<const T*>(a0.in) + from, n * sizeof(T));
  for (int j = 1; j < c.size(); ++j)
    local_reduce_into(out, static_cast<const T*>(c.args[static_cast<std::size_t>(j)].in) + from, n, a0.op);
}
template <class T>
void local_allgather_v_chunk(const local_collective& c, std::size_t k) {
  const auto& a0 = c.args[0];
  const std::size_t at = local_block_start(a0, k), n = a0.counts[k];
  if (n == 0) return;
  const T* src = static_cast<const T*>(c.args[k].out) + at;
  for (int j = 0; j < c.size(); ++j)
    if (static_cast<std::size_t>(j) != k) std::memcpy(static_cast<T*>(c.args[static_cast<std::size_t>(j)].out) + at, src, n * sizeof(T));
}

/// The arguments of a data collective with its chunk plan for `size` ranks.
template <class T>
local_args local_data_args(local_kind kind, const void* in, void* out, std::size_t count, int size) {
  constexpr std::size_t len = local_chunk_elements<T>();
  const std::size_t pieces = (count + len - 1) / len;
  local_args a;
  a.kind = kind;
  a.type = &local_type_tag<T>;
  a.type_name = local_type_name<T>();
  a.count = count;
  a.in = in;
  a.out = out;
  switch (kind) {
    case local_kind::broadcast:
      a.chunk = &local_broadcast_chunk<T>;
      a.chunks = size > 1 ? pieces : 0;
      break;
    case local_kind::allreduce:
      a.chunk = &local_allreduce_chunk<T>;
      a.chunks = size > 1 ? pieces : 0;
      break;
    case local_kind::reduce_scatter:
      a.chunk = &local_reduce_scatter_chunk<T>;
      a.chunks = pieces * static_cast<std::size_t>(size);
      break;
    case local_kind::allgather:
      a.chunk = &local_allgather_chunk<T>;
      a.chunks = pieces * static_cast<std::size_t>(size);
      break;
    case local_kind::reduce_scatter_v:
      a.chunk = &local_reduce_scatter_v_chunk<T>;
      a.chunks = static_cast<std::size_t>(size);
      break;
    case local_kind::allgather_v:
      a.chunk = &local_allgather_v_chunk<T>;
      a.chunks = static_cast<std::size_t>(size);
      break;
    default: break;
  }
  return a;
}

/// Once every rank has posted: checks that they agree, then plans the work (split: builds the
/// new groups). Mutex held.
inline void local_finish_posting(local_collective& c, const local_group& g) {
  const auto& a0 = c.args[0];
  const std::string op = std::string("local_comm::") + to_string(a0.kind);
  const std::string seq = " (collective #" + std::to_string(c.seq) + " on this communicator)";
  for (int j = 1; j < c.size() && c.error.empty(); ++j) {
    const auto& a = c.args[static_cast<std::size_t>(j)];
    const std::string rj = "rank " + std::to_string(j);
    if (a.kind != a0.kind) {
      c.error = "local_comm: rank 0 calls " + std::string(to_string(a0.kind)) + " but " + rj + " calls " +
                to_string(a.kind) + seq + ": every rank must call the same collectives in the same order";
    } else if (a.type != a0.type) {
      c.error = op + ": rank 0 passes " + a0.type_name + " elements but " + rj + " passes " + a.type_name;
    } else if (a.count != a0.count) {
      c.error = op + ": rank 0 passes " + std::to_string(a0.count) + " elements but " + rj + " passes " +
                std::to_string(a.count);
    } else if (a0.kind == local_kind::broadcast && a.root != a0.root) {
      c.error = op + ": rank 0 names root " + std::to_string(a0.root) + " but " + rj + " names root " +
                std::to_string(a.root);
    } else if (a.counts != a0.counts) {
      c.error = op + ": rank 0 and " + rj + " pass different block counts";
    } else if ((a0.kind == local_kind::allreduce || a0.kind == local_kind::reduce_scatter ||
                a0.kind == local_kind::reduce_scatter_v) && a.op != a0.op) {
      c.error = op + ": rank 0 asks for " + to_string(a0.op) + " but " + rj + " for " + to_string(a.op);
    }
  }
  if (c.error.empty() && a0.kind == local_kind::broadcast && (a0.root < 0 || a0.root >= c.size())) {
    c.error = op + ": root " + std::to_string(a0.root) + " is not a rank of this communicator of " +
              std::to_string(c.size());
  }
  if (c.error.empty() && a0.kind == local_kind::split) {
    for (int j = 0; j < c.size() && c.error.empty(); ++j)
      if (c.args[static_cast<std::size_t>(j)].colour < 0)
        c.error = op + ": rank " + std::to_string(j) + " passes colour " +
                  std::to_string(c.args[static_cast<std::size_t>(j)].colour) + "; colours must be >= 0";
  }
  if (!c.error.empty()) return;
  c.chunk = a0.chunk;
  c.chunks = a0.chunks;
  if (a0.kind == local_kind::split) {
    std::map<int, std::vector<std::pair<int, int>>> by_colour;  // colour -> (key, old rank)
    for (int j = 0; j < c.size(); ++j)
      by_colour[c.args[static_cast<std::size_t>(j)].colour].emplace_back(c.args[static_cast<std::size_t>(j)].key, j);
    c.groups.resize(static_cast<std::size_t>(c.size()));
    c.new_rank.resize(static_cast<std::size_t>(c.size()));
    for (auto& [colour, members] : by_colour) {
      std::sort(members.begin(), members.end());
      std::vector<int> world;
      for (auto [key, j] : members) world.push_back(g.world(j));
      auto group = std::make_shared<local_group>(std::move(world));
      for (std::size_t i = 0; i < members.size(); ++i) {
        c.groups[static_cast<std::size_t>(members[i].second)] = group;
        c.new_rank[static_cast<std::size_t>(members[i].second)] = static_cast<int>(i);
      }
    }
  }
}

/// Posts rank r's arguments to its next collective on g; returns the collective.
inline std::shared_ptr<local_collective> local_post(local_state& s, local_group& g, int r, local_args a) {
  std::lock_guard lock(s.mutex);
  if (s.failed) s.throw_failed();
  const std::uint64_t seq = g.next_seq[static_cast<std::size_t>(r)]++;
  auto& slot = g.pending[seq];
  if (!slot) slot = std::make_shared<local_collective>(seq, g.size());
  auto c = slot;
  a.posted = true;
  c->args[static_cast<std::size_t>(r)] = a;
  if (++c->posted == c->size()) {
    g.pending.erase(seq);
    local_finish_posting(*c, g);
    s.cv.notify_all();
  }
  return c;
}

/// The first rank of g that has not posted c and has returned from its function, or -1.
inline int local_absent_rank(const local_state& s, const local_group& g, const local_collective& c) {
  if (c.posted == c.size()) return -1;
  for (int j = 0; j < c.size(); ++j)
    if (!c.args[static_cast<std::size_t>(j)].posted && s.exited[static_cast<std::size_t>(g.world(j))]) return j;
  return -1;
}

struct local_collective_waiter final : local_waiter {
  local_collective_waiter(const local_state& s_, const local_group& g_, const local_collective& c_, int r_)
      : s(s_), g(g_), c(c_), r(r_) {}
  const local_state& s;
  const local_group& g;
  const local_collective& c;
  int r;

  bool ready() const override {
    if (!c.error.empty() || s.failed || local_absent_rank(s, g, c) >= 0) return true;
    return c.posted == c.size() && (c.done == c.chunks || (c.next < c.chunks && !c.aborted));
  }
  std::string describe() const override {
    std::string text = "rank " + std::to_string(g.world(r)) + " waits in " +
                       to_string(c.args[static_cast<std::size_t>(r)].kind) + " #" + std::to_string(c.seq);
    std::string missing;
    for (int j = 0; j < c.size(); ++j)
      if (!c.args[static_cast<std::size_t>(j)].posted) missing += (missing.empty() ? "" : ", ") + std::to_string(g.world(j));
    return missing.empty() ? text : text + " for rank(s) " + missing;
  }
};

struct local_drain_waiter final : local_waiter {
  local_drain_waiter(const local_group& g_, const local_collective& c_, int r_) : g(g_), c(c_), r(r_) {}
  const local_group& g;
  const local_collective& c;
  int r;
  bool ready() const override { return c.running == 0; }
  std::string describe() const override { return "rank " + std::to_string(g.world(r)) + " waits for copies to stop"; }
};

/// Stops c (no more chunks start) and waits for the chunks that are running. Mutex held.
inline void local_abort(std::unique_lock<std::mutex>& lock, local_state& s, const local_group& g,
                        local_collective& c, int r) {
  c.aborted = true;
  const local_drain_waiter w(g, c, r);
  while (c.running != 0) s.block(lock, g.world(r), w);
}

/// Takes rank r of g through collective c: runs chunks while there are any, returns true once
/// c is complete; with block == false returns false instead of waiting. Throws on the run's
/// failure, on disagreeing arguments, or when a rank c needs has returned.
inline bool local_progress(local_state& s, local_group& g, local_collective& c, int r, bool block) {
  std::unique_lock lock(s.mutex);
  for (;;) {
    if (!c.error.empty()) throw communication_error(c.error);
    if (c.posted == c.size()) {
      if (c.done == c.chunks) return true;
      if (!c.aborted && !s.failed && c.next < c.chunks) {
        const std::size_t k = c.next++;
        ++c.running;
        lock.unlock();
        c.chunk(c, k);
        lock.lock();
        --c.running;
        ++c.done;
        if (c.done == c.chunks || (c.aborted && c.running == 0)) s.cv.notify_all();
        continue;
      }
    }
    if (s.failed) {
      local_abort(lock, s, g, c, r);
      s.throw_failed();
    }
    if (const int j = local_absent_rank(s, g, c); j >= 0) {
      throw communication_error("local_comm::" + std::string(to_string(c.args[static_cast<std::size_t>(r)].kind)) +
                                ": rank " + std::to_string(g.world(r)) + " waits for rank " +
                                std::to_string(g.world(j)) + ", which returned without calling it");
    }
    if (!block) return false;
    s.block(lock, g.world(r), local_collective_waiter(s, g, c, r));
  }
}

/// Removes an unmatched message from its mailbox. Mutex held.
inline void local_unpost(local_group& g, const local_message& m) {
  auto& box = m.is_send ? g.mailbox[static_cast<std::size_t>(m.dest)].sends
                        : g.mailbox[static_cast<std::size_t>(m.dest)].recvs;
  std::erase_if(box, [&](const auto& p) { return p.get() == &m; });
}

/// Hands a send to a receive (copying under the mutex, so an abandoned message is never half
/// read) and completes both. Mutex held.
inline void local_match(local_message& send, local_message& recv) {
  if (send.bytes != recv.bytes) {
    recv.error = "local_comm::recv: rank " + std::to_string(recv.dest) + " expects " + std::to_string(recv.count) +
                 " " + recv.type_name + " elements (" + std::to_string(recv.bytes) + " bytes) from rank " +
                 std::to_string(recv.source) + " with tag " + std::to_string(recv.tag) + " but the message holds " +
                 std::to_string(send.count) + " " + send.type_name + " elements (" + std::to_string(send.bytes) +
                 " bytes)";
  } else if (send.bytes != 0) {
    std::memcpy(recv.dst, send.src, send.bytes);
  }
  send.done = recv.done = true;
}

/// Posts a send or receive of rank m.is_send ? m.source : m.dest, matching it with the oldest
/// partner already posted.
inline std::shared_ptr<local_message> local_post(local_state& s, local_group& g, local_message msg) {
  auto m = std::make_shared<local_message>(std::move(msg));
  std::lock_guard lock(s.mutex);
  if (s.failed) s.throw_failed();
  auto& box = g.mailbox[static_cast<std::size_t>(m->dest)];
  auto& partners = m->is_send ? box.recvs : box.sends;
  const auto it = std::find_if(partners.begin(), partners.end(), [&](const auto& p) {
    return p->source == m->source && p->tag == m->tag;
  });
  if (it == partners.end()) {
    (m->is_send ? box.sends : box.recvs).push_back(m);
  } else {
    m->is_send ? local_match(*m, **it) : local_match(**it, *m);
    partners.erase(it);
    s.cv.notify_all();
  }
  return m;
}

struct local_message_waiter final : local_waiter {
  local_message_waiter(const local_state& s_, const local_group& g_, const local_message& m_)
      : s(s_), g(g_), m(m_) {}
  const local_state& s;
  const local_group& g;
  const local_message& m;
  int peer() const noexcept { return m.is_send ? m.dest : m.source; }
  int self() const noexcept { return m.is_send ? m.source : m.dest; }
  bool ready() const override {
    return m.done || s.failed || s.exited[static_cast<std::size_t>(g.world(peer()))];
  }
  std::string describe() const override {
    return "rank " + std::to_string(g.world(self())) + " waits in " + (m.is_send ? "send to" : "recv from") +
           " rank " + std::to_string(g.world(peer())) + " (tag " + std::to_string(m.tag) + ")";
  }
};

/// Takes a send or receive to completion; with block == false returns false instead of waiting.
inline bool local_progress(local_state& s, local_group& g, local_message& m, bool block) {
  std::unique_lock lock(s.mutex);
  const local_message_waiter w(s, g, m);
  for (;;) {
    if (m.done) {
      if (!m.error.empty()) throw communication_error(m.error);
      return true;
    }
    if (s.failed) {
      local_unpost(g, m);
      s.throw_failed();
    }
    if (s.exited[static_cast<std::size_t>(g.world(w.peer()))]) {
      local_unpost(g, m);
      throw communication_error(std::string("local_comm::") + (m.is_send ? "send" : "recv") + ": rank " +
                                std::to_string(g.world(w.self())) + " waits for rank " +
                                std::to_string(g.world(w.peer())) + " (tag " + std::to_string(m.tag) +
                                "), which returned without " + (m.is_send ? "receiving" : "sending") + " it");
    }
    if (!block) return false;
    s.block(lock, g.world(w.self()), w);
  }
}

inline std::string local_what(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace detail

/// One rank of a local_world: a communicator whose ranks are threads of this process.
///
/// Collectives go through the ranks' own buffers: each rank posts its pointers, and once all
/// have, the copying and reducing is cut into chunks that every waiting rank takes, so the work
/// is spread over the threads. Sums run in rank order ((x0 + x1) + x2 ...) whichever thread
/// computes them, so results are bitwise reproducible. Collectives match by order: it is
/// correct for any sequence of calls as long as every rank of a communicator calls the same
/// collectives (blocking or not) in the same order; ranks that disagree on the operation, the
/// element type, the count, the root or the operator all get communication_error instead of
/// wrong data.
///
/// Non-blocking operations: iallreduce's work is done by the ranks that wait on it or test it
/// once every rank has started it (it may complete at wait()); isend and irecv complete as soon
/// as their partner is posted. A blocking send waits until the message is received (like
/// MPI_Ssend), so a program that works here does not rely on MPI buffering.
///
/// Failures never hang: when a rank's function throws, every operation blocked in (or later
/// called by) the other ranks throws communication_error("local_comm: rank K failed: <what>")
/// with K the world rank; when every running rank waits and none can go on (a deadlock), all
/// get communication_error naming what each waits for; a rank waiting for one whose function
/// has returned gets communication_error saying so.
///
/// A local_comm is used by its own thread only. Copies share the communicator.
class local_comm {
 public:
  class request;

  /// This thread's index in the communicator, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// The number of ranks (threads) in the communicator.
  int size() const noexcept { return group_->size(); }
  /// "local".
  std::string name() const { return "local"; }

  /// Collective: the ranks passing the same colour form a new communicator, ranked by
  /// (key, old rank). Requires colour >= 0. Throws communication_error.
  local_comm split(int colour, int key) {
    detail::local_args a;
    a.kind = detail::local_kind::split;
    a.colour = colour;
    a.key = key;
    const auto c = post(a);
    detail::local_progress(*state_, *group_, *c, rank_, true);
    const auto r = static_cast<std::size_t>(rank_);
    return local_comm(state_, c->groups[r], c->new_rank[r]);
  }

  /// Returns once every rank has entered the barrier. Throws communication_error.
  void barrier() {
    detail::local_args a;
    a.kind = detail::local_kind::barrier;
    const auto c = post(a);
    detail::local_progress(*state_, *group_, *c, rank_, true);
  }

  /// Copies the root's data[0, count) to every rank's data. Throws communication_error.
  template <detail::comm_value T>
  void broadcast(T* data, std::size_t count, int root) {
    auto a = detail::local_data_args<T>(detail::local_kind::broadcast, data, data, count, size());
    a.root = root;
    const auto c = post(a);
    detail::local_progress(*state_, *group_, *c, rank_, true);
  }

  /// In place: every rank's data[i] becomes op over all ranks' data[i], in rank order.
  /// Throws communication_error.
  template <detail::comm_reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    auto r = iallreduce(data, count, op);
    r.wait();
  }

  /// in holds size() blocks of count; out[0, count) gets op over every rank's block rank().
  /// Requires in and out not to overlap. Throws communication_error.
  template <detail::comm_reducible T>
  void reduce_scatter(const T* in, T* out, std::size_t count, reduce_op op) {
    auto a = detail::local_data_args<T>(detail::local_kind::reduce_scatter, in, out, count, size());
    a.op = op;
    const auto c = post(a);
    detail::local_progress(*state_, *group_, *c, rank_, true);
  }

  /// out (size() * count) gets every rank's in (count), block r from rank r. Requires in and
  /// out not to overlap. Throws communication_error.
  template <detail::comm_value T>
  void allgather(const T* in, T* out, std::size_t count) {
    const auto c = post(detail::local_data_args<T>(detail::local_kind::allgather, in, out, count, size()));
    detail::local_progress(*state_, *group_, *c, rank_, true);
  }

  /// Sends data[0, count) to peer with tag; returns once the peer has received it.
  /// Throws communication_error (peer out of range, negative tag, failure).
  template <detail::comm_value T>
  void send(const T* data, std::size_t count, int peer, int tag) {
    isend(data, count, peer, tag).wait();
  }

  /// Receives count elements from peer with tag into data. Throws communication_error (also
  /// when the message holds a different count).
  template <detail::comm_value T>
  void recv(T* data, std::size_t count, int peer, int tag) {
    irecv(data, count, peer, tag).wait();
  }

  /// Starts an in-place allreduce; see allreduce. data must stay untouched until the request
  /// completes. Throws communication_error.
  template <detail::comm_reducible T>
  [[nodiscard]] request iallreduce(T* data, std::size_t count, reduce_op op);

  /// Starts a send; see send. Throws communication_error.
  template <detail::comm_value T>
  [[nodiscard]] request isend(const T* data, std::size_t count, int peer, int tag);

  /// Starts a receive; see recv. Throws communication_error.
  template <detail::comm_value T>
  [[nodiscard]] request irecv(T* data, std::size_t count, int peer, int tag);

  /// Starts a reduce-scatter of blocks of different sizes: in holds size() consecutive blocks,
  /// block j of counts[j] elements (the same counts on every rank; copied); out[0,
  /// counts[rank()]) gets op over every rank's block rank(), in rank order. in and out must not
  /// overlap. Throws communication_error.
  template <detail::comm_reducible T>
  [[nodiscard]] request ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op);

  /// Starts an in-place allgather of blocks of different sizes: data holds size() consecutive
  /// blocks, block j of counts[j] elements; block rank() is this rank's, every other block is
  /// copied from its rank. Throws communication_error.
  template <detail::comm_value T>
  [[nodiscard]] request iallgather_v(T* data, const std::size_t* counts);
  /// The same, blocking.
  template <detail::comm_reducible T>
  void reduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op);
  template <detail::comm_value T>
  void allgather_v(T* data, const std::size_t* counts);

 private:
  friend class local_world;

  local_comm(std::shared_ptr<detail::local_state> state, std::shared_ptr<detail::local_group> group, int rank)
      : state_(std::move(state)), group_(std::move(group)), rank_(rank) {}

  std::shared_ptr<detail::local_collective> post(const detail::local_args& a) {
    return detail::local_post(*state_, *group_, rank_, a);
  }

  template <class T>
  request post_v(detail::local_kind kind, const T* in, T* out, const std::size_t* counts, reduce_op op);

  template <class T>
  detail::local_message message(bool is_send, std::size_t count, int peer, int tag, const char* what) const {
    if (peer < 0 || peer >= size())
      throw communication_error(std::string("local_comm::") + what + ": rank " + std::to_string(rank_) + ": peer " +
                                std::to_string(peer) + " is not a rank of this communicator of " +
                                std::to_string(size()));
    if (tag < 0)
      throw communication_error(std::string("local_comm::") + what + ": rank " + std::to_string(rank_) + ": tag " +
                                std::to_string(tag) + " is negative; tags must be >= 0");
    detail::local_message m;
    m.is_send = is_send;
    m.source = is_send ? rank_ : peer;
    m.dest = is_send ? peer : rank_;
    m.tag = tag;
    m.count = count;
    m.bytes = count * sizeof(T);
    m.type_name = detail::local_type_name<T>();
    return m;
  }

  std::shared_ptr<detail::local_state> state_;
  std::shared_ptr<detail::local_group> group_;
  int rank_;
};

/// A pending local_comm operation. Movable; wait() blocks until it completes, test() says
/// whether it has (doing its share of the work); both are no-ops once it has completed or on
/// a default-constructed request. A request destroyed while pending waits in its destructor
/// (ignoring errors, which its peers report); destroyed while an exception propagates, it
/// abandons the operation and fails the run, so that its peers throw instead of hanging.
class local_comm::request {
 public:
  request() = default;
  request(request&& other) noexcept { take(other); }
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish();
      take(other);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish(); }

  /// Blocks until the operation has completed. Throws communication_error.
  void wait() { progress(true); }

  /// True once the operation has completed; does its share of the work, never waits for other
  /// ranks. Throws communication_error.
  bool test() { return progress(false); }

 private:
  friend class local_comm;

  bool pending() const noexcept { return collective_ != nullptr || message_ != nullptr; }

  void take(request& other) noexcept {
    state_ = std::move(other.state_);
    group_ = std::move(other.group_);
    collective_ = std::move(other.collective_);
    message_ = std::move(other.message_);
    rank_ = other.rank_;
    uncaught_ = other.uncaught_;
  }

  bool progress(bool block) {
    if (!pending()) return true;
    bool done = false;
    try {
      done = collective_ ? detail::local_progress(*state_, *group_, *collective_, rank_, block)
                         : detail::local_progress(*state_, *group_, *message_, block);
    } catch (...) {
      collective_.reset();
      message_.reset();
      throw;
    }
    if (done) {
      collective_.reset();
      message_.reset();
    }
    return done;
  }

  void finish() noexcept {
    if (!pending()) return;
    if (std::uncaught_exceptions() > uncaught_) {
      abandon();
      return;
    }
    try {
      wait();
    } catch (...) {  // the peers' own waits report the failure
    }
  }

  void abandon() noexcept {
    std::unique_lock lock(state_->mutex);
    const char* what = collective_ ? "iallreduce" : message_->is_send ? "isend" : "irecv";
    state_->fail(group_->world(rank_),
                 std::string("an exception propagated while its ") + what + " was pending");
    if (collective_) {
      if (!collective_->complete()) detail::local_abort(lock, *state_, *group_, *collective_, rank_);
    } else if (!message_->done) {
      detail::local_unpost(*group_, *message_);
    }
    collective_.reset();
    message_.reset();
  }

  std::shared_ptr<detail::local_state> state_;
  std::shared_ptr<detail::local_group> group_;
  std::shared_ptr<detail::local_collective> collective_;
  std::shared_ptr<detail::local_message> message_;
  int rank_ = 0;
  int uncaught_ = 0;
};

template <class T>
local_comm::request local_comm::post_v(detail::local_kind kind, const T* in, T* out, const std::size_t* counts, reduce_op op) {
  const std::size_t n = static_cast<std::size_t>(size());
  std::size_t total = 0;
  for (std::size_t j = 0; j < n; ++j) total += counts[j];
  auto a = detail::local_data_args<T>(kind, in, out, total, size());
  a.op = op;
  a.counts.assign(counts, counts + n);
  request r;
  r.uncaught_ = std::uncaught_exceptions();
  r.collective_ = post(a);
  r.state_ = state_;
  r.group_ = group_;
  r.rank_ = rank_;
  return r;
}

template <detail::comm_reducible T>
local_comm::request local_comm::ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
  return post_v<T>(detail::local_kind::reduce_scatter_v, in, out, counts, op);
}

template <detail::comm_value T>
local_comm::request local_comm::iallgather_v(T* data, const std::size_t* counts) {
  return post_v<T>(detail::local_kind::allgather_v, data, data, counts, reduce_op::sum);
}

template <detail::comm_reducible T>
void local_comm::reduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
  ireduce_scatter_v(in, out, counts, op).wait();
}

template <detail::comm_value T>
void local_comm::allgather_v(T* data, const std::size_t* counts) {
  iallgather_v(data, counts).wait();
}

template <detail::comm_reducible T>
local_comm::request local_comm::iallreduce(T* data, std::size_t count, reduce_op op) {
  auto a = detail::local_data_args<T>(detail::local_kind::allreduce, data, data, count, size());
  a.op = op;
  request r;
  r.uncaught_ = std::uncaught_exceptions();
  r.collective_ = post(a);
  r.state_ = state_;
  r.group_ = group_;
  r.rank_ = rank_;
  return r;
}

template <detail::comm_value T>
local_comm::request local_comm::isend(const T* data, std::size_t count, int peer, int tag) {
  auto m = message<T>(true, count, peer, tag, "send");
  m.src = data;
  request r;
  r.uncaught_ = std::uncaught_exceptions();
  r.message_ = detail::local_post(*state_, *group_, std::move(m));
  r.state_ = state_;
  r.group_ = group_;
  r.rank_ = rank_;
  return r;
}

template <detail::comm_value T>
local_comm::request local_comm::irecv(T* data, std::size_t count, int peer, int tag) {
  auto m = message<T>(false, count, peer, tag, "recv");
  m.dst = data;
  request r;
  r.uncaught_ = std::uncaught_exceptions();
  r.message_ = detail::local_post(*state_, *group_, std::move(m));
  r.state_ = state_;
  r.group_ = group_;
  r.rank_ = rank_;
  return r;
}

/// A world of `size()` ranks run as threads of this process:
///
///     loom::local_world w(4);
///     w.run([](loom::local_comm& c) { ... c.allreduce(g.data(), g.size(), loom::reduce_op::sum); });
///
/// Each run starts a fresh world: new threads, new communicators.
class local_world {
 public:
  /// Requires 1 <= size. Throws invalid_argument.
  explicit local_world(int size) : size_(size) {
    if (size < 1) throw invalid_argument("local_world: size " + std::to_string(size) + " must be at least 1");
  }

  /// The number of ranks (threads) each run starts.
  int size() const noexcept { return size_; }

  /// Runs f(comm) on size() threads, rank = thread index, and joins them. When a function
  /// throws, the others' communication throws too (see local_comm), and run rethrows the
  /// exception of the rank that failed first.
  template <class F>
    requires std::invocable<F&, local_comm&>
  void run(F&& f) const {
    const auto state = std::make_shared<detail::local_state>(size_);
    std::vector<int> ranks(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[static_cast<std::size_t>(r)] = r;
    const auto world = std::make_shared<detail::local_group>(std::move(ranks));

    auto body = [&](int r) {
      const auto ri = static_cast<std::size_t>(r);
      try {
        local_comm comm(state, world, r);
        f(comm);
        std::lock_guard lock(state->mutex);
        state->exited[ri] = 1;
        state->detect_deadlock();
        state->cv.notify_all();
      } catch (...) {
        std::lock_guard lock(state->mutex);
        state->errors[ri] = std::current_exception();
        state->exited[ri] = 1;
        state->fail(r, detail::local_what(state->errors[ri]));
      }
    };

    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(size_));
    try {
      for (int r = 0; r < size_; ++r) threads.emplace_back(body, r);
    } catch (...) {
      {
        std::lock_guard lock(state->mutex);
        for (auto r = threads.size(); r < state->exited.size(); ++r) state->exited[r] = 1;
        state->fail(static_cast<int>(threads.size()), "could not start its thread: " +
                                                          detail::local_what(std::current_exception()));
      }
      for (auto& t : threads) t.join();
      throw;
    }
    for (auto& t : threads) t.join();

    if (!state->failed) return;
    if (state->failed_rank >= 0 && state->errors[static_cast<std::size_t>(state->failed_rank)])
      std::rethrow_exception(state->errors[static_cast<std::size_t>(state->failed_rank)]);
    for (const auto& e : state->errors)
      if (e) std::rethrow_exception(e);
    state->throw_failed();
  }

 private:
  int size_;
};

static_assert(communicator<local_comm>);

}  // namespace loom
