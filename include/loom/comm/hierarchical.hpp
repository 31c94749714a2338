// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::hierarchical_comm: a loom::communicator over MPI whose allreduce (blocking and not) is
// hierarchical — reduced inside each host over shared memory, reduced across hosts, spread back
// inside each host — as Horovod's hierarchical allreduce and NCCL's trees do; so are ZeRO's
// reduce-scatter and allgather of blocks (reduce_scatter_v, allgather_v) where every host holds
// the same number of ranks; every other operation is the flat loom::mpi_comm's. Not a new
// transport: every call is an MPI collective on a sub-communicator. Needs the loom::mpi component.


#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/core/error.hpp"

namespace loom {

/// How a hierarchical_comm's allreduce crosses hosts (H hosts of L ranks each):
/// - `slice`: every rank takes part. Inside the host a reduce-scatter leaves local rank l with
///   the host's sum of slice l (1/L of the elements); the ranks with local index l allreduce
///   their slice across hosts (L allreduces of n/L elements at once, one per local rank); an
///   allgather inside the host puts the slices together. Needs every host to hold the same
///   number of ranks (otherwise `leader` is used).
/// - `leader`: one rank per host (local rank 0) takes part across hosts. Inside the host a
///   reduce to the leader; the leaders allreduce all n elements; a broadcast inside the host.
enum class hierarchical_variant { slice, leader };

/// What a hierarchical_comm's allreduce does, as decided at construction from the hosts found:
/// - `one_host`: every rank is on one host: the flat allreduce (MPI's shared-memory algorithms
///   are already the intra-host stage).
/// - `one_rank_per_host`: every host holds one rank: the flat allreduce (there is nothing to
///   reduce inside a host).
/// - `slice`, `leader`: hierarchical, as hierarchical_variant says.
enum class hierarchical_mode { one_host, one_rank_per_host, slice, leader };

/// "one host (flat)", "one rank per host (flat)", "slice" or "leader".
constexpr const char* to_string(hierarchical_mode m) noexcept {
  switch (m) {
    case hierarchical_mode::one_host: return "one host (flat)";
    case hierarchical_mode::one_rank_per_host: return "one rank per host (flat)";
    case hierarchical_mode::slice: return "slice";
    case hierarchical_mode::leader: return "leader";
  }
  return "?";
}

/// How a hierarchical_comm groups ranks into hosts and crosses them.
struct hierarchical_options {
  /// slice (default) or leader; see hierarchical_variant.
  hierarchical_variant variant = hierarchical_variant::slice;
  /// 0 (default): a host is the ranks that share memory (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED). k > 0: a host is k consecutive ranks (ranks [0, k), [k, 2k), ...;
  /// the last may hold fewer) — to simulate several hosts on one machine, or to group by
  /// something MPI cannot see (a socket, a switch).
  int ranks_per_host = 0;

  /// The options the environment asks for: LOOM_HIER_HOST_SIZE=k (ranks_per_host; unset or 0:
  /// by shared memory) and LOOM_HIER_VARIANT=slice|leader. Every rank must see the same values.
  /// Throws invalid_argument for any other value.
  static hierarchical_options from_environment() {
    hierarchical_options o;
    if (const char* v = std::getenv("LOOM_HIER_HOST_SIZE"); v && *v) {
      char* end = nullptr;
      const long k = std::strtol(v, &end, 10);
      if (*end != '\0' || k < 0 || k > INT_MAX)
        throw invalid_argument(std::string("loom::hierarchical_comm: LOOM_HIER_HOST_SIZE='") + v +
                               "' is not a number of ranks per host (a whole number >= 0; 0: by shared memory)");
      o.ranks_per_host = static_cast<int>(k);
    }
    if (const char* v = std::getenv("LOOM_HIER_VARIANT"); v && *v) {
      const std::string s = v;
      if (s == "slice") o.variant = hierarchical_variant::slice;
      else if (s == "leader") o.variant = hierarchical_variant::leader;
      else
        throw invalid_argument("loom::hierarchical_comm: LOOM_HIER_VARIANT='" + s + "' is neither 'slice' nor 'leader'");
    }
    return o;
  }
};

namespace detail {

/// One hierarchical allreduce in flight: three stages (inside the host, across hosts, inside
/// the host again), each one non-blocking MPI collective per chunk of at most max_count
/// elements, posted when the stage before has completed here and every earlier operation has
/// posted this stage (so that every rank posts the collectives of each communicator in the
/// same order, as MPI requires).
struct hier_op {
  /// allreduce: three stages; reduce_scatter (of blocks, hier_state::plan_blocks): a reduce-scatter
  /// inside the host, then one across hosts; allgather (of blocks): an allgather across hosts,
  /// then one inside the host.
  enum class kind { allreduce, reduce_scatter, allgather };
  kind what = kind::allreduce;
  int stages = 3;
  std::byte* data = nullptr;
  std::size_t count = 0;
  std::size_t elem = 0;  // bytes per element
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  struct chunk {
    std::size_t at = 0, len = 0;      // elements of data
    std::vector<int> counts, displs;  // slice: each local rank's slice of this chunk
    std::size_t scratch_at = 0;       // slice: where this rank's slice lies in scratch (elements)
  };
  std::vector<chunk> chunks;
  std::vector<std::byte> scratch;  // slice: this rank's slices, reduced over the host then across hosts
  std::vector<MPI_Request> reqs;   // the stage in flight
  int posted = 0;                  // stages posted: 0..3
  bool in_flight = false;
  bool done = false;
  std::string error;  // set when a stage failed: thrown by the owner's wait or test
  // reduce_scatter / allgather of blocks: block j (flat rank j's) has counts[j] elements at
  // at[j] of data (reduce_scatter: of in; out receives this rank's block).
  const std::byte* in = nullptr;
  std::vector<std::size_t> counts, at;
  std::vector<std::byte> pack;  // every block, ordered by (local index, cross rank) of its owner
  std::vector<int> lcounts, ldispls;  // inside the host: each local index's group of blocks in pack
  std::vector<int> ccounts, cdispls;  // across hosts: the blocks of this local index's group
  // The non-blocking reduce-scatter's stages: mpi_comm::ireduce_scatter_v (its direct exchange,
  // 2-5x faster than MPI_Ireduce_scatter, see mpi_comm) on the stage's communicator, posted by
  // post_stage (typed where the operation started); exchange is the stage in flight.
  std::vector<std::size_t> lcounts_z, ccounts_z;
  std::function<mpi_comm::request(int)> post_stage;
  mpi_comm::request exchange;
  const char* name() const noexcept {
    return what == kind::allreduce ? "iallreduce" : what == kind::reduce_scatter ? "ireduce_scatter_v" : "iallgather_v";
  }
};

/// The communicators of a hierarchical_comm (shared by its copies and its requests) and the
/// queue of its non-blocking allreduces.
struct hier_state {
  mpi_comm flat;
  hierarchical_mode mode = hierarchical_mode::one_host;
  hierarchical_variant variant = hierarchical_variant::slice;
  int host_id = 0;     // the same on every rank of a host (kept by split)
  int hosts = 1;       // hosts in this communicator
  int local_rank = 0;  // this rank's index on its host
  int local_size = 1;  // ranks on this host
  // Blocking allreduce: inside the host, and across hosts (slice: the ranks of this local
  // index; leader: the leaders).
  std::unique_ptr<mpi_comm> local, cross;
  // Non-blocking: one communicator per stage, so that each carries its collectives in the
  // order the operations were started on every rank, whatever order they complete in.
  std::unique_ptr<mpi_comm> nb_in, nb_cross, nb_out;
  std::vector<std::byte> scratch;  // the blocking slice allreduce's
  std::vector<std::byte> block_scratch;  // the blocking reduce_scatter_v's and allgather_v's
  std::deque<std::shared_ptr<hier_op>> pending;
  // Slice mode, for the blocks of reduce_scatter_v / allgather_v: members[l][c] is the flat
  // rank with local index l and rank c across hosts; cross_rank is this rank's c. Their
  // non-blocking allgathers have communicators of their own (across hosts first, then inside),
  // in the order of the stages that every operation posts in turn.
  std::vector<std::vector<int>> members;
  int cross_rank = 0;
  std::unique_ptr<mpi_comm> nb_ag_cross, nb_ag_local;

  explicit hier_state(mpi_comm c) : flat(std::move(c)) {}

  bool leader() const noexcept { return local_rank == 0; }
  static MPI_Comm raw(const std::unique_ptr<mpi_comm>& c) noexcept { return c->native(); }
  bool hierarchical() const noexcept {
    return mode == hierarchical_mode::slice || mode == hierarchical_mode::leader;
  }

  [[noreturn]] void fail(const char* op, const std::string& cause) const {
    throw communication_error(std::string("loom::hierarchical_comm::") + op + ": rank " + std::to_string(flat.rank()) +
                              " (local rank " + std::to_string(local_rank) + " of " + std::to_string(local_size) +
                              " on host " + std::to_string(host_id) + ", " + to_string(mode) + "): " + cause);
  }
  std::string stage_error(const char* stage, int code) const {
    return std::string(stage) + " failed: " + mpi_error_string(code);
  }
  void check(int code, const char* op, const char* stage) const {
    if (code != MPI_SUCCESS) fail(op, stage_error(stage, code));
  }

  /// The chunks of an allreduce of n elements: pieces of at most max_count elements; for the
  /// slice variant each split into local_size slices as even as can be (the first n % L one
  /// larger).
  void plan(hier_op& o) const {
    const std::size_t max = flat.max_count();
    std::size_t scratch_at = 0;
    for (std::size_t at = 0; at < o.count; at += max) {
      hier_op::chunk c;
      c.at = at;
      c.len = std::min(max, o.count - at);
      if (mode == hierarchical_mode::slice) {
        const auto l = static_cast<std::size_t>(local_size);
        c.counts.resize(l);
        c.displs.resize(l);
        std::size_t d = 0;
        for (std::size_t i = 0; i < l; ++i) {
          const std::size_t k = c.len / l + (i < c.len % l ? 1 : 0);
          c.counts[i] = static_cast<int>(k);
          c.displs[i] = static_cast<int>(d);
          d += k;
        }
        c.scratch_at = scratch_at;
        scratch_at += static_cast<std::size_t>(c.counts[static_cast<std::size_t>(local_rank)]);
      }
      o.chunks.push_back(std::move(c));
    }
    if (mode == hierarchical_mode::slice) o.scratch.resize(scratch_at * o.elem);
  }

  /// The layout of a reduce-scatter or allgather of blocks (counts: flat size() values): where
  /// each block lies in data and in pack, and the counts of both stages. False where a stage's
  /// count does not fit the flat communicator's max_count() (the flat operation is used then).
  bool plan_blocks(hier_op& o, const std::size_t* counts) const {
    const auto n = static_cast<std::size_t>(flat.size());
    const auto l_n = static_cast<std::size_t>(local_size);
    const auto h_n = static_cast<std::size_t>(hosts);
    o.counts.assign(counts, counts + n);
    o.at.resize(n);
    std::size_t total = 0;
    for (std::size_t j = 0; j < n; ++j) o.at[j] = total, total += counts[j];
    if (total > flat.max_count()) return false;
    o.count = total;
    o.lcounts.assign(l_n, 0);
    o.ldispls.assign(l_n, 0);
    o.ccounts.assign(h_n, 0);
    o.cdispls.assign(h_n, 0);
    std::size_t d = 0;
    for (std::size_t l = 0; l < l_n; ++l) {
      o.ldispls[l] = static_cast<int>(d);
      for (std::size_t c = 0; c < h_n; ++c) {
        const std::size_t k = counts[static_cast<std::size_t>(members[l][c])];
        if (l == static_cast<std::size_t>(local_rank)) {
          o.cdispls[c] = static_cast<int>(d - static_cast<std::size_t>(o.ldispls[l]));
          o.ccounts[c] = static_cast<int>(k);
        }
        d += k;
      }
      o.lcounts[l] = static_cast<int>(d - static_cast<std::size_t>(o.ldispls[l]));
    }
    o.pack.resize(total * o.elem);
    return true;
  }
  /// Copies every block from src (flat order) into o.pack (grouped by local index), or back.
  void pack_blocks(hier_op& o, const std::byte* src) const {
    std::byte* p = o.pack.data();
    for (const auto& group : members)
      for (const int j : group) {
        const std::size_t b = o.counts[static_cast<std::size_t>(j)] * o.elem;
        if (b) std::memcpy(p, src + o.at[static_cast<std::size_t>(j)] * o.elem, b);
        p += b;
      }
  }
  void unpack_blocks(const hier_op& o, std::byte* dst) const {
    const std::byte* p = o.pack.data();
    for (const auto& group : members)
      for (const int j : group) {
        const std::size_t b = o.counts[static_cast<std::size_t>(j)] * o.elem;
        if (b && j != flat.rank()) std::memcpy(dst + o.at[static_cast<std::size_t>(j)] * o.elem, p, b);
        p += b;
      }
  }
  /// Where this rank's own block lies in o.pack.
  std::byte* own_in_pack(hier_op& o) const {
    return o.pack.data() + static_cast<std::size_t>(o.ldispls[static_cast<std::size_t>(local_rank)] +
                                                    o.cdispls[static_cast<std::size_t>(cross_rank)]) * o.elem;
  }

  void reduce_scatter_blocking(hier_op& o) {
    const char* name = "reduce_scatter_v";
    pack_blocks(o, o.in);
    const int mine = o.lcounts[static_cast<std::size_t>(local_rank)];
    o.scratch.resize(static_cast<std::size_t>(mine) * o.elem);
    check(MPI_Reduce_scatter(o.pack.data(), o.scratch.data(), o.lcounts.data(), o.type, o.op, raw(local)), name,
          "the reduce-scatter inside the host");
    check(MPI_Reduce_scatter(o.scratch.data(), o.data, o.ccounts.data(), o.type, o.op, raw(cross)), name,
          "the reduce-scatter across hosts");
  }
  void allgather_blocking(hier_op& o) {
    const char* name = "allgather_v";
    const std::size_t own = o.counts[static_cast<std::size_t>(flat.rank())] * o.elem;
    if (own) std::memcpy(own_in_pack(o), o.data + o.at[static_cast<std::size_t>(flat.rank())] * o.elem, own);
    std::byte* group = o.pack.data() + static_cast<std::size_t>(o.ldispls[static_cast<std::size_t>(local_rank)]) * o.elem;
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, group, o.ccounts.data(), o.cdispls.data(), o.type, raw(cross)),
          name, "the allgather across hosts");
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, o.pack.data(), o.lcounts.data(), o.ldispls.data(), o.type,
                         raw(local)),
          name, "the allgather inside the host");
    unpack_blocks(o, o.data);
  }

  // ---- blocking ---------------------------------------------------------------------------
  /// The blocking allreduce across hosts (slice: of this rank's slice; leader: by the leaders),
  /// as MPI_Iallreduce + MPI_Wait on the cross communicator: libnbc's ring, which
  /// loom::mpi::environment makes the default, rather than the blocking MPI_Allreduce that Open
  /// MPI 4.1 runs on a communicator of 2. On 2 hosts x 2 ranks with a 200 Mbit/s or 1 Gbit/s
  /// link, the blocking call made the slice allreduce 0.94-1.09x the flat one at 4 and 16 MiB;
  /// this makes it 1.25-1.48x (equal below 4 MiB; docs/hierarchical.md, "Measured").
  int allreduce_across(std::byte* data, int count, const hier_op& o) {
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, data, count, o.type, o.op, raw(cross), &r);
    return rc != MPI_SUCCESS ? rc : MPI_Wait(&r, MPI_STATUS_IGNORE);
  }

  void allreduce_blocking(hier_op& o) {
    const char* name = "allreduce";
    if (mode == hierarchical_mode::slice) {
      std::byte* s = o.scratch.data();
      for (const auto& c : o.chunks) {
        const int mine = c.counts[static_cast<std::size_t>(local_rank)];
        std::byte* d = o.data + c.at * o.elem;
        std::byte* slot = s + c.scratch_at * o.elem;
        check(MPI_Reduce_scatter(d, slot, c.counts.data(), o.type, o.op, raw(local)), name, "the reduce-scatter inside the host");
        check(allreduce_across(slot, mine, o), name, "the allreduce of this slice across hosts");
        check(MPI_Allgatherv(slot, mine, o.type, d, c.counts.data(), c.displs.data(), o.type, raw(local)), name,
              "the allgather inside the host");
      }
      return;
    }
    for (const auto& c : o.chunks) {
      std::byte* d = o.data + c.at * o.elem;
      const int n = static_cast<int>(c.len);
      check(MPI_Reduce(leader() ? MPI_IN_PLACE : d, leader() ? d : nullptr, n, o.type, o.op, 0, raw(local)), name,
            "the reduce to the host's leader");
      if (leader())
        check(allreduce_across(d, n, o), name, "the allreduce across the hosts' leaders");
      check(MPI_Bcast(d, n, o.type, 0, raw(local)), name, "the broadcast inside the host");
    }
  }

  // ---- non-blocking ---------------------------------------------------------------------
  /// Posts stage o.posted of o. Sets o.error (and o.done) on failure.
  void post(hier_op& o) {
    static constexpr const char* slice_stages[] = {"the reduce-scatter inside the host",
                                                   "the allreduce of this slice across hosts",
                                                   "the allgather inside the host"};
    static constexpr const char* leader_stages[] = {"the reduce to the host's leader",
                                                    "the allreduce across the hosts' leaders",
                                                    "the broadcast inside the host"};
    const int stage = o.posted;
    o.reqs.clear();
    if (o.what != hier_op::kind::allreduce) {
      const bool rs = o.what == hier_op::kind::reduce_scatter;
      static constexpr const char* rs_stages[] = {"the reduce-scatter inside the host", "the reduce-scatter across hosts"};
      static constexpr const char* ag_stages[] = {"the allgather across hosts", "the allgather inside the host"};
      MPI_Request r = MPI_REQUEST_NULL;
      int rc = MPI_SUCCESS;
      std::byte* group = o.pack.data() + static_cast<std::size_t>(o.ldispls[static_cast<std::size_t>(local_rank)]) * o.elem;
      if (rs) {
        if (stage == 0) {
          pack_blocks(o, o.in);
          o.scratch.resize(static_cast<std::size_t>(o.lcounts[static_cast<std::size_t>(local_rank)]) * o.elem);
          o.lcounts_z.assign(o.lcounts.begin(), o.lcounts.end());
          o.ccounts_z.assign(o.ccounts.begin(), o.ccounts.end());
        }
        try {
          o.exchange = o.post_stage(stage);
        } catch (const std::exception& e) {
          o.error = std::string(rs_stages[stage]) + " failed: " + e.what();
          o.done = true;
          return;
        }
        ++o.posted;
        o.in_flight = true;
        return;
      } else if (stage == 0) {
        const std::size_t own = o.counts[static_cast<std::size_t>(flat.rank())] * o.elem;
        if (own) std::memcpy(own_in_pack(o), o.data + o.at[static_cast<std::size_t>(flat.rank())] * o.elem, own);
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, group, o.ccounts.data(), o.cdispls.data(), o.type,
                             raw(nb_ag_cross), &r);
      } else {
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, o.pack.data(), o.lcounts.data(), o.ldispls.data(), o.type,
                             raw(nb_ag_local), &r);
      }
      if (rc != MPI_SUCCESS) {
        o.error = stage_error(rs ? rs_stages[stage] : ag_stages[stage], rc);
        o.done = true;
        return;
      }
      o.reqs.push_back(r);
      ++o.posted;
      o.in_flight = true;
      return;
    }
    for (const auto& c : o.chunks) {
      std::byte* d = o.data + c.at * o.elem;
      int rc = MPI_SUCCESS;
      MPI_Request r = MPI_REQUEST_NULL;
      if (mode == hierarchical_mode::slice) {
        const int mine = c.counts[static_cast<std::size_t>(local_rank)];
        std::byte* slot = o.scratch.data() + c.scratch_at * o.elem;
        if (stage == 0) rc = MPI_Ireduce_scatter(d, slot, c.counts.data(), o.type, o.op, raw(nb_in), &r);
        else if (stage == 1) rc = MPI_Iallreduce(MPI_IN_PLACE, slot, mine, o.type, o.op, raw(nb_cross), &r);
        else rc = MPI_Iallgatherv(slot, mine, o.type, d, c.counts.data(), c.displs.data(), o.type, raw(nb_out), &r);
      } else {
        const int n = static_cast<int>(c.len);
        if (stage == 0) rc = MPI_Ireduce(leader() ? MPI_IN_PLACE : d, leader() ? d : nullptr, n, o.type, o.op, 0, raw(nb_in), &r);
        else if (stage == 1) {
          if (!leader()) continue;  // only the leaders cross hosts
          rc = MPI_Iallreduce(MPI_IN_PLACE, d, n, o.type, o.op, raw(nb_cross), &r);
        } else {
          rc = MPI_Ibcast(d, n, o.type, 0, raw(nb_out), &r);
        }
      }
      if (rc != MPI_SUCCESS) {
        o.error = stage_error(mode == hierarchical_mode::slice ? slice_stages[stage] : leader_stages[stage], rc);
        o.done = true;
        return;
      }
      o.reqs.push_back(r);
    }
    ++o.posted;
    o.in_flight = true;
  }

  /// Whether o's stage in flight has completed here (without blocking, or blocking); on
  /// completion marks o done if that was its last stage.
  void poll(hier_op& o, bool block) {
    if (!o.in_flight) return;
    if (o.what == hier_op::kind::reduce_scatter) {
      try {
        if (block) o.exchange.wait();
        else if (!o.exchange.test()) return;
      } catch (const std::exception& e) {
        o.error = "stage " + std::to_string(o.posted) + " of 2 failed: " + e.what();
        o.done = true;
        o.in_flight = false;
        return;
      }
      o.in_flight = false;
      if (o.posted == o.stages) o.done = true;
      return;
    }
    int flag = 1;
    const int n = static_cast<int>(o.reqs.size());
    const int rc = block ? MPI_Waitall(n, o.reqs.data(), MPI_STATUSES_IGNORE)
                         : MPI_Testall(n, o.reqs.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      o.error = "stage " + std::to_string(o.posted) + " of " + std::to_string(o.stages) + " failed: " + mpi_error_string(rc);
      o.done = true;
      o.in_flight = false;
      return;
    }
    if (!flag) return;
    o.in_flight = false;
    o.reqs.clear();
    if (o.posted == o.stages) {
      if (o.what == hier_op::kind::allgather) unpack_blocks(o, o.data);
      o.done = true;
    }
  }

  /// One pass over the operations in flight, oldest first: each completed stage is followed
  /// by the next where every older operation has posted that one already. Never blocks.
  void progress() {
    int older = INT_MAX;  // the fewest stages any older pending operation has posted
    for (auto& p : pending) {
      hier_op& o = *p;
      while (!o.done) {
        poll(o, false);
        if (o.in_flight || o.done || o.posted >= older) break;
        post(o);
      }
      if (!o.done) older = std::min(older, o.posted);
    }
    std::erase_if(pending, [](const std::shared_ptr<hier_op>& q) { return q->done; });
  }

  /// Blocks until o is complete, driving the older operations first: the oldest can always
  /// post its next stage, so waiting on its stage in flight always moves the queue.
  void wait_for(const hier_op& o) {
    for (;;) {
      progress();
      if (o.done) return;
      poll(*pending.front(), true);
    }
  }

  std::shared_ptr<hier_op> start(std::shared_ptr<hier_op> o) {
    pending.push_back(o);
    post(*o);  // stage 0: every older operation has posted it at its start
    progress();
    return o;
  }
};

}  // namespace detail

/// A communicator over MPI whose allreduce and iallreduce are hierarchical (see
/// hierarchical_variant and hierarchical_mode): reduced inside each host over shared memory,
/// reduced across hosts, spread back inside each host. Every other operation, and allreduce
/// itself where there is one host or one rank per host, is the flat loom::mpi_comm's. See
/// loom::communicator for the operations.
///
/// Hosts are the ranks that share memory (MPI_COMM_TYPE_SHARED), or groups of
/// hierarchical_options::ranks_per_host consecutive ranks (also from LOOM_HIER_HOST_SIZE, to
/// simulate hosts on one machine). A hierarchical allreduce of n elements takes the same
/// counts, types (float, double, integers, loom::bf16 / loom::fp16 summed in float at each
/// step) and operators as mpi_comm's, in chunks of at most the flat communicator's
/// max_count(); its sums are added in another order than the flat allreduce's, so floats may
/// differ in the last bits (integers, and sums exact in the type, are equal).
///
/// Construction and split are collective over the flat communicator (they make five
/// sub-communicators, seven in the slice mode). Failure detection and recovery
/// (mpi_comm::watch_for_failures) are not offered: a trainer over
/// data_parallel<hierarchical_comm> does not detect dead ranks.
/// Only the thread that constructed loom::mpi::environment calls it (MPI_THREAD_FUNNELED).
/// Non-blocking allreduces advance their stages in their requests' test() and wait() (and in
/// any other request's of the same communicator): test them now and then.
class hierarchical_comm {
 public:
  class request;

  /// Groups `flat`'s ranks into hosts as `options` says and builds the sub-communicators.
  /// Collective over flat. Throws communication_error, invalid_argument (a negative
  /// ranks_per_host, or ranks that disagree on it or on the variant).
  explicit hierarchical_comm(mpi_comm flat, hierarchical_options options = hierarchical_options::from_environment())
      : s_(std::make_shared<detail::hier_state>(std::move(flat))) {
    detail::hier_state& s = *s_;
    if (options.ranks_per_host < 0)
      throw invalid_argument("loom::hierarchical_comm: ranks_per_host " + std::to_string(options.ranks_per_host) +
                             " is negative (0: group by shared memory)");
    // Every rank must group alike: the options' maximum and minimum agree.
    std::int64_t mine[2] = {options.ranks_per_host * 2 + static_cast<int>(options.variant),
                            -(options.ranks_per_host * 2 + static_cast<int>(options.variant))};
    s.flat.allreduce(mine, 2, reduce_op::max);
    if (mine[0] != -mine[1])
      throw invalid_argument("loom::hierarchical_comm: rank " + std::to_string(s.flat.rank()) +
                             ": the ranks were given different ranks_per_host or variants (LOOM_HIER_HOST_SIZE, "
                             "LOOM_HIER_VARIANT must be the same on every rank)");
    int host = 0;
    if (options.ranks_per_host > 0) {
      host = s.flat.rank() / options.ranks_per_host;
    } else {
      MPI_Comm shared = MPI_COMM_NULL;
      s.check(MPI_Comm_split_type(s.flat.native(), MPI_COMM_TYPE_SHARED, s.flat.rank(), MPI_INFO_NULL, &shared),
              "hierarchical_comm", "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
      // The host's id: its lowest rank in flat.
      int lowest = s.flat.rank();
      const int rc = MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, shared);
      MPI_Comm_free(&shared);
      s.check(rc, "hierarchical_comm", "finding the host's lowest rank");
      host = lowest;
    }
    build(options.variant, host);
  }

  /// Every process of the job, grouped as the environment says
  /// (hierarchical_options::from_environment). Collective.
  static hierarchical_comm world() { return hierarchical_comm(mpi_comm::world()); }

  int rank() const noexcept { return s_->flat.rank(); }
  int size() const noexcept { return s_->flat.size(); }
  /// "hierarchical".
  std::string name() const { return "hierarchical"; }

  /// What allreduce does here: one_host / one_rank_per_host (flat), slice or leader.
  hierarchical_mode mode() const noexcept { return s_->mode; }
  /// The number of hosts, this rank's index on its host and the ranks on its host.
  int hosts() const noexcept { return s_->hosts; }
  int local_rank() const noexcept { return s_->local_rank; }
  int local_size() const noexcept { return s_->local_size; }
  /// The flat communicator every operation but allreduce uses.
  mpi_comm& flat() noexcept { return s_->flat; }
  const mpi_comm& flat() const noexcept { return s_->flat; }

  /// Collective: the ranks passing the same colour form a new hierarchical communicator,
  /// ranked by (key, old rank); its hosts are this one's. Throws communication_error.
  hierarchical_comm split(int colour, int key) {
    if (colour < 0)
      s_->fail("split", "colour " + std::to_string(colour) + " is negative; colours must be >= 0");
    return hierarchical_comm(s_->flat.split(colour, key), s_->variant, s_->host_id);
  }

  void barrier() { s_->flat.barrier(); }

  template <detail::comm_value T>
  void broadcast(T* data, std::size_t count, int root) {
    s_->flat.broadcast(data, count, root);
  }

  /// In place: every rank's data[i] becomes op over all ranks' data[i], hierarchically (see
  /// the class). Throws communication_error naming the stage that failed.
  template <detail::comm_reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    detail::hier_state& s = *s_;
    if (!s.hierarchical()) return s.flat.allreduce(data, count, op);
    if (count == 0) return;
    detail::hier_op o = make_op(data, count, op);
    o.scratch.swap(s.scratch);  // the communicator's scratch, grown as needed, kept for the next call
    s.plan(o);
    s.allreduce_blocking(o);
    o.scratch.swap(s.scratch);
  }

  template <detail::comm_reducible T>
  void reduce_scatter(const T* in, T* out, std::size_t count, reduce_op op) {
    s_->flat.reduce_scatter(in, out, count, op);
  }

  template <detail::comm_value T>
  void allgather(const T* in, T* out, std::size_t count) {
    s_->flat.allgather(in, out, count);
  }

  /// Reduce-scatter of blocks of different sizes, as mpi_comm::reduce_scatter_v says (in holds
  /// size() blocks, block j of counts[j] elements; out gets op over every rank's block
  /// rank()), hierarchically in the slice mode: a reduce-scatter inside the host leaves local
  /// rank l with the host's sums of the blocks of every rank with local index l, and those
  /// ranks reduce-scatter them across hosts. A host's link then carries what the host's ranks
  /// own, not what a flat ring passes through it. The blocks are copied into a buffer grouped by
  /// local index first (the size of in). In the other modes, and where the whole exceeds
  /// max_count(), the flat one. Sums are added in another order than the flat one's (floats may
  /// differ in the last bits). Throws communication_error naming the stage that failed.
  template <detail::comm_reducible T>
  void reduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
    detail::hier_state& s = *s_;
    detail::hier_op o = make_op(out, 0, op);
    if (s.mode != hierarchical_mode::slice) return s.flat.reduce_scatter_v(in, out, counts, op);
    o.pack.swap(s.block_scratch);  // the communicator's buffers, grown as needed, kept for the next call
    o.scratch.swap(s.scratch);
    const bool fits = s.plan_blocks(o, counts);
    if (fits) {
      o.in = reinterpret_cast<const std::byte*>(in);
      s.reduce_scatter_blocking(o);  // (a throw drops the buffers: they are only scratch)
    }
    o.pack.swap(s.block_scratch);
    o.scratch.swap(s.scratch);
    if (!fits) s.flat.reduce_scatter_v(in, out, counts, op);
  }

  /// In-place allgather of blocks of different sizes, as mpi_comm::allgather_v says,
  /// hierarchically in the slice mode: the ranks of each local index gather their blocks across
  /// hosts, then the host gathers those groups inside; through a buffer of the whole's size. In
  /// the other modes, and where the whole exceeds max_count(), the flat one. Throws
  /// communication_error.
  template <detail::comm_value T>
  void allgather_v(T* data, const std::size_t* counts) {
    detail::hier_state& s = *s_;
    detail::hier_op o = make_op(data, 0, reduce_op::sum);
    if (s.mode != hierarchical_mode::slice) return s.flat.allgather_v(data, counts);
    o.pack.swap(s.block_scratch);
    const bool fits = s.plan_blocks(o, counts);
    if (fits) s.allgather_blocking(o);
    o.pack.swap(s.block_scratch);
    if (!fits) s.flat.allgather_v(data, counts);
  }

  /// Starts reduce_scatter_v; in and out must stay untouched until the request completes.
  template <detail::comm_reducible T>
  [[nodiscard]] request ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op);

  /// Starts allgather_v; data must stay untouched until the request completes.
  template <detail::comm_value T>
  [[nodiscard]] request iallgather_v(T* data, const std::size_t* counts);

  template <detail::comm_value T>
  void send(const T* data, std::size_t count, int peer, int tag) {
    s_->flat.send(data, count, peer, tag);
  }

  template <detail::comm_value T>
  void recv(T* data, std::size_t count, int peer, int tag) {
    s_->flat.recv(data, count, peer, tag);
  }

  /// Starts an in-place hierarchical allreduce; see allreduce. data must stay untouched until
  /// the request completes. Throws communication_error.
  template <detail::comm_reducible T>
  [[nodiscard]] request iallreduce(T* data, std::size_t count, reduce_op op);

  template <detail::comm_value T>
  [[nodiscard]] request isend(const T* data, std::size_t count, int peer, int tag);

  template <detail::comm_value T>
  [[nodiscard]] request irecv(T* data, std::size_t count, int peer, int tag);

 private:
  hierarchical_comm(mpi_comm flat, hierarchical_variant variant, int host)
      : s_(std::make_shared<detail::hier_state>(std::move(flat))) {
    build(variant, host);
  }

  /// Splits the flat communicator by host (colour: the host's id) and across hosts (colour:
  /// the local rank), and decides the mode. Collective.
  void build(hierarchical_variant variant, int host) {
    detail::hier_state& s = *s_;
    s.variant = variant;
    s.host_id = host;
    mpi_comm local = s.flat.split(host, s.flat.rank());
    s.local_rank = local.rank();
    s.local_size = local.size();
    // hosts, the largest and the smallest host.
    std::int64_t f[3] = {s.local_rank == 0 ? 1 : 0, s.local_size, -s.local_size};
    s.flat.allreduce(f, 1, reduce_op::sum);
    s.flat.allreduce(f + 1, 2, reduce_op::max);
    s.hosts = static_cast<int>(f[0]);
    const bool even = f[1] == -f[2];
    if (s.hosts == 1) s.mode = hierarchical_mode::one_host;
    else if (f[1] == 1) s.mode = hierarchical_mode::one_rank_per_host;
    else if (variant == hierarchical_variant::slice && even) s.mode = hierarchical_mode::slice;
    else s.mode = hierarchical_mode::leader;
    if (!s.hierarchical()) return;
    mpi_comm cross = s.flat.split(s.local_rank, s.flat.rank());
    s.nb_in = std::make_unique<mpi_comm>(local.split(0, local.rank()));
    s.nb_out = std::make_unique<mpi_comm>(local.split(0, local.rank()));
    s.nb_cross = std::make_unique<mpi_comm>(cross.split(0, cross.rank()));
    if (s.mode == hierarchical_mode::slice) {
      // Who is where: every rank's (local index, rank across hosts).
      s.cross_rank = cross.rank();
      const int mine[2] = {s.local_rank, s.cross_rank};
      std::vector<int> all(2 * static_cast<std::size_t>(s.flat.size()));
      s.flat.allgather(mine, all.data(), 2);
      s.members.assign(static_cast<std::size_t>(s.local_size), std::vector<int>(static_cast<std::size_t>(s.hosts), -1));
      for (int r = 0; r < s.flat.size(); ++r) {
        const auto l = static_cast<std::size_t>(all[2 * static_cast<std::size_t>(r)]);
        const auto c = static_cast<std::size_t>(all[2 * static_cast<std::size_t>(r) + 1]);
        s.members[l][c] = r;
      }
      s.nb_ag_cross = std::make_unique<mpi_comm>(cross.split(0, cross.rank()));
      s.nb_ag_local = std::make_unique<mpi_comm>(local.split(0, local.rank()));
    }
    s.local = std::make_unique<mpi_comm>(std::move(local));
    s.cross = std::make_unique<mpi_comm>(std::move(cross));
  }

  template <class T>
  detail::hier_op make_op(T* data, std::size_t count, reduce_op op) {
    detail::hier_op o;
    o.data = reinterpret_cast<std::byte*>(data);
    o.count = count;
    o.elem = sizeof(T);
    o.type = detail::mpi_datatype<T>();
    if constexpr (detail::comm_reducible<T>) o.op = detail::mpi_op<T>(op);
    return o;
  }

  std::shared_ptr<detail::hier_state> s_;
};

/// A pending hierarchical_comm operation: a flat mpi_comm request (isend, irecv, and
/// iallreduce where the mode is flat) or a hierarchical allreduce in flight. Movable; wait()
/// blocks until it completes, test() advances it (and the older allreduces of its
/// communicator) and says whether it has; both are no-ops once complete or on a
/// default-constructed request. A request destroyed while pending waits in its destructor (an
/// error there is printed to stderr).
class hierarchical_comm::request {
 public:
  request() = default;
  request(request&& other) noexcept = default;
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish();
      flat_ = std::move(other.flat_);
      op_ = std::move(other.op_);
      state_ = std::move(other.state_);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish(); }

  /// Blocks until the operation has completed. Throws communication_error.
  void wait() {
    flat_.wait();
    if (!op_) return;
    state_->wait_for(*op_);
    done();
  }

  /// True once the operation has completed. Throws communication_error.
  bool test() {
    if (!flat_.test()) return false;
    if (!op_) return true;
    state_->progress();
    if (!op_->done) return false;
    done();
    return true;
  }

 private:
  friend class hierarchical_comm;

  void done() {
    const std::string error = std::move(op_->error);
    const char* name = op_->name();
    op_.reset();
    if (!error.empty()) state_->fail(name, error);
  }

  void finish() noexcept {
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: %s (in a request's destructor)\n", e.what());
    }
  }

  mpi_comm::request flat_;
  std::shared_ptr<detail::hier_op> op_;
  std::shared_ptr<detail::hier_state> state_;
};

template <detail::comm_reducible T>
hierarchical_comm::request hierarchical_comm::iallreduce(T* data, std::size_t count, reduce_op op) {
  request r;
  detail::hier_state& s = *s_;
  if (!s.hierarchical()) {
    r.flat_ = s.flat.iallreduce(data, count, op);
    return r;
  }
  if (count == 0) return r;
  auto o = std::make_shared<detail::hier_op>(make_op(data, count, op));
  s.plan(*o);
  r.state_ = s_;
  r.op_ = s.start(std::move(o));
  if (r.op_->done && !r.op_->error.empty()) r.done();  // stage 0 could not start
  return r;
}

template <detail::comm_reducible T>
hierarchical_comm::request hierarchical_comm::ireduce_scatter_v(const T* in, T* out, const std::size_t* counts, reduce_op op) {
  request r;
  detail::hier_state& s = *s_;
  auto o = std::make_shared<detail::hier_op>(make_op(out, 0, op));
  if (s.mode != hierarchical_mode::slice || !s.plan_blocks(*o, counts)) {
    r.flat_ = s.flat.ireduce_scatter_v(in, out, counts, op);
    return r;
  }
  o->what = detail::hier_op::kind::reduce_scatter;
  o->stages = 2;
  o->in = reinterpret_cast<const std::byte*>(in);
  // (the state owns the communicators and the queue that owns o: plain pointers do)
  o->post_stage = [st = &s, op_ = o.get(), out, op](int stage) -> mpi_comm::request {
    if (stage == 0)
      return st->nb_in->ireduce_scatter_v(reinterpret_cast<const T*>(op_->pack.data()),
                                          reinterpret_cast<T*>(op_->scratch.data()), op_->lcounts_z.data(), op);
    return st->nb_cross->ireduce_scatter_v(reinterpret_cast<const T*>(op_->scratch.data()), out, op_->ccounts_z.data(), op);
  };
  r.state_ = s_;
  r.op_ = s.start(std::move(o));
  if (r.op_->done && !r.op_->error.empty()) r.done();  // stage 0 could not start
  return r;
}

template <detail::comm_value T>
hierarchical_comm::request hierarchical_comm::iallgather_v(T* data, const std::size_t* counts) {
  request r;
  detail::hier_state& s = *s_;
  auto o = std::make_shared<detail::hier_op>(make_op(data, 0, reduce_op::sum));
  if (s.mode != hierarchical_mode::slice || !s.plan_blocks(*o, counts)) {
    r.flat_ = s.flat.iallgather_v(data, counts);
    return r;
  }
  o->what = detail::hier_op::kind::allgather;
  o->stages = 2;
  r.state_ = s_;
  r.op_ = s.start(std::move(o));
  if (r.op_->done && !r.op_->error.empty()) r.done();  // stage 0 could not start
  return r;
}

template <detail::comm_value T>
hierarchical_comm::request hierarchical_comm::isend(const T* data, std::size_t count, int peer, int tag) {
  request r;
  r.flat_ = s_->flat.isend(data, count, peer, tag);
  return r;
}

template <detail::comm_value T>
hierarchical_comm::request hierarchical_comm::irecv(T* data, std::size_t count, int peer, int tag) {
  request r;
  r.flat_ = s_->flat.irecv(data, count, peer, tag);
  return r;
}

static_assert(communicator<hierarchical_comm>);

}  // namespace loom
