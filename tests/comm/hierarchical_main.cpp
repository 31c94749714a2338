// SPDX-License-Identifier: Apache-2.0
// Catch2's main for test_comm_hier, inside loom::mpi::environment (every process mpirun starts
// runs the same tests; the exit code is nonzero when any rank failed), and the checks that only
// loom::hierarchical_comm has: its grouping and mode, exact sums for many counts (0, 1, odd,
// not divisible by the ranks, above the chunk size) blocking and not, many allreduces in flight
// advanced in a different order on every rank (and reduce-scatters and allgathers of blocks
// among them), and its errors. communicator_test.cpp runs the
// whole communicator contract on it as well (harness.hpp, LOOM_TEST_HIER).

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "harness.hpp"
#include "loom/comm/hierarchical.hpp"
#include "loom/core/half.hpp"

using namespace comm_test;
using loom::hierarchical_comm;
using loom::hierarchical_mode;
using loom::hierarchical_variant;
using loom::reduce_op;

namespace {

/// What a world of n ranks grouped by k consecutive ranks must report.
hierarchical_mode expected_mode(int n, int k, hierarchical_variant v) {
  const int hosts = (n + k - 1) / k;
  if (hosts == 1) return hierarchical_mode::one_host;
  if (k == 1) return hierarchical_mode::one_rank_per_host;
  return v == hierarchical_variant::slice && n % k == 0 ? hierarchical_mode::slice : hierarchical_mode::leader;
}

/// Runs f(comm, checker) on hierarchical communicators of every grouping and variant, counts
/// split at INT_MAX and at 1000 elements.
template <class F>
void on_groupings(F&& f) {
  const int n = loom::mpi_comm::world().size();
  for (const int k : {2, 3, 1, n})
    for (const auto v : {hierarchical_variant::slice, hierarchical_variant::leader})
      for (const std::size_t max_count : {static_cast<std::size_t>(INT_MAX), std::size_t{1000}}) {
        hierarchical_comm c(loom::mpi_comm::world().with_max_count(max_count), {.variant = v, .ranks_per_host = k});
        checker ck;
        ck.rank = c.rank();
        try {
          f(c, ck);
          c.barrier();
        } catch (const std::exception& e) {
          loom::mpi::abort(3, std::string("unexpected exception in '") + Catch::getResultCapture().getCurrentTestName() +
                                  "': " + e.what());
        }
        report(ck, std::to_string(k) + " ranks per host, " + loom::to_string(c.mode()) + ", max_count " +
                       std::to_string(max_count));
      }
}

constexpr std::size_t counts[] = {0, 1, 2, 3, 4, 5, 7, 8, 31, 63, 64, 65, 127, 999, 1000, 1001, 4097, 65537, 300007};

template <class T>
T element(int rank, std::size_t i) {
  if constexpr (loom::is_half_v<T>) return T::from_float(static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 9) - 4));
  else return value<T>(rank, i);
}
template <class T>
double as_double(T v) {
  if constexpr (loom::is_half_v<T>) return v.to_float();
  else return static_cast<double>(v);
}

}  // namespace

TEST_CASE("hierarchical_comm groups ranks into hosts and says which mode its allreduce is in", "[comm][hierarchical]") {
  auto world = loom::mpi_comm::world();
  const int n = world.size();
  for (const int k : {0, 1, 2, 3, n})
    for (const auto v : {hierarchical_variant::slice, hierarchical_variant::leader}) {
      hierarchical_comm c(world, {.variant = v, .ranks_per_host = k});
      CHECK(c.name() == "hierarchical");
      CHECK(c.rank() == world.rank());
      CHECK(c.size() == n);
      if (k == 0) {  // by shared memory: one machine here
        CHECK(c.mode() == hierarchical_mode::one_host);
        CHECK(c.hosts() == 1);
        CHECK(c.local_size() == n);
        continue;
      }
      INFO(k << " ranks per host, " << n << " ranks, variant " << (v == hierarchical_variant::slice ? "slice" : "leader"));
      CHECK(c.mode() == expected_mode(n, k, v));
      CHECK(c.hosts() == (n + k - 1) / k);
      CHECK(c.local_rank() == world.rank() % k);
      CHECK(c.local_size() == std::min(k, n - world.rank() / k * k));
      // A split keeps the hosts: the even ranks of 2-rank hosts are one rank per host.
      if (k == 2 && n >= 4) {
        hierarchical_comm part = c.split(world.rank() % 2, 0);
        CHECK(part.mode() == hierarchical_mode::one_rank_per_host);
        CHECK(part.hosts() == (n + 1 - world.rank() % 2) / 2);
      }
    }
}

TEST_CASE("hierarchical_comm sums and takes maxima exactly for every count, type and grouping, blocking and not",
          "[comm][hierarchical]") {
  on_groupings([]<class C>(C& c, checker& k) {
    for_types<float, double, std::int32_t, std::int64_t, loom::bf16, loom::fp16>([&]<class T>(std::type_identity<T>) {
      for (const reduce_op op : {reduce_op::sum, reduce_op::max}) {
        if (loom::is_half_v<T> && op == reduce_op::max) continue;
        for (const std::size_t n : counts) {
          std::vector<T> a(n), b(n);
          std::vector<double> want(n);
          for (std::size_t i = 0; i < n; ++i) {
            a[i] = b[i] = element<T>(c.rank(), i);
            want[i] = as_double(element<T>(0, i));
            for (int r = 1; r < c.size(); ++r)
              want[i] = op == reduce_op::sum ? want[i] + as_double(element<T>(r, i)) : std::max(want[i], as_double(element<T>(r, i)));
          }
          c.allreduce(a.data(), n, op);
          auto req = c.iallreduce(b.data(), n, op);
          req.wait();
          std::vector<double> got(n), got_nb(n);
          for (std::size_t i = 0; i < n; ++i) got[i] = as_double(a[i]), got_nb[i] = as_double(b[i]);
          const std::string what = std::string(loom::to_string(op)) + " of " + std::to_string(n) + " " +
                                   (loom::is_half_v<T> ? std::string("16-bit floats") : type_name<T>());
          k.equal("allreduce " + what, got, want);
          k.equal("iallreduce " + what, got_nb, want);
        }
      }
    });
  });
}

TEST_CASE("hierarchical_comm's allreduces in flight complete whatever order each rank advances them in",
          "[comm][hierarchical]") {
  on_groupings([]<class C>(C& c, checker& k) {
    constexpr int ops = 24;
    std::vector<std::vector<float>> data(ops);
    std::vector<typename C::request> reqs;
    std::vector<std::vector<float>> want(ops);
    for (int j = 0; j < ops; ++j) {
      const std::size_t n = counts[static_cast<std::size_t>(j) % std::size(counts)] + static_cast<std::size_t>(j);
      data[static_cast<std::size_t>(j)] = values<float>(c.rank(), n, j);
      auto& w = want[static_cast<std::size_t>(j)];
      w = values<float>(0, n, j);
      for (int r = 1; r < c.size(); ++r)
        for (std::size_t i = 0; i < n; ++i) w[i] += value<float>(r, i, j);
      reqs.push_back(c.iallreduce(data[static_cast<std::size_t>(j)].data(), n, reduce_op::sum));
      // As data_parallel does: a blocking allreduce while others are in flight.
      if (j == ops / 2) {
        std::int64_t count = 1;
        c.allreduce(&count, 1, reduce_op::sum);
        k.expect(count == c.size(), "a blocking allreduce among pending ones counts " + std::to_string(count));
      }
    }
    // Each rank tests them in its own random order for a while, then waits in reverse.
    std::mt19937 g(static_cast<unsigned>(c.rank()) * 7919u + 1u);
    for (int polls = 0; polls < 200; ++polls) reqs[g() % ops].test();
    for (int j = ops - 1; j >= 0; --j) reqs[static_cast<std::size_t>(j)].wait();
    for (int j = 0; j < ops; ++j)
      k.equal("iallreduce " + std::to_string(j) + " of " + std::to_string(want[static_cast<std::size_t>(j)].size()),
              data[static_cast<std::size_t>(j)], want[static_cast<std::size_t>(j)]);
    // Requests destroyed while pending wait for themselves.
    std::vector<float> x = values<float>(c.rank(), 5000, 3);
    { auto dropped = c.iallreduce(x.data(), x.size(), reduce_op::max); }
    auto wx = values<float>(0, 5000, 3);
    for (int r = 1; r < c.size(); ++r)
      for (std::size_t i = 0; i < wx.size(); ++i) wx[i] = std::max(wx[i], value<float>(r, i, 3));
    k.equal("an iallreduce whose request was destroyed pending", x, wx);
  });
}

TEST_CASE("hierarchical_comm's reduce-scatters and allgathers of blocks in flight among allreduces complete in any order",
          "[comm][hierarchical]") {
  on_groupings([]<class C>(C& c, checker& k) {
    const auto ranks = static_cast<std::size_t>(c.size());
    const auto me = static_cast<std::size_t>(c.rank());
    constexpr int ops = 18;
    struct one {
      int kind = 0;  // 0 iallreduce, 1 ireduce_scatter_v, 2 iallgather_v
      std::vector<std::size_t> counts;
      std::vector<std::int64_t> in, data, want;
    };
    std::vector<one> all(ops);
    std::vector<typename C::request> reqs;
    for (int j = 0; j < ops; ++j) {
      one& o = all[static_cast<std::size_t>(j)];
      o.kind = j % 3;
      // Blocks of different sizes, some empty; the largest pass max_count 1000 (the flat path).
      o.counts.resize(ranks);
      for (std::size_t b = 0; b < ranks; ++b)
        o.counts[b] = (b + static_cast<std::size_t>(j)) % 4 == 3 ? 0 : counts[(static_cast<std::size_t>(j) + b * 5) % std::size(counts)] % 700;
      std::size_t total = 0, mine_at = 0;
      for (std::size_t b = 0; b < ranks; ++b) {
        if (b < me) mine_at += o.counts[b];
        total += o.counts[b];
      }
      if (o.kind == 0) {
        o.data = values<std::int64_t>(c.rank(), total, j);
        o.want.assign(total, 0);
        for (int r = 0; r < c.size(); ++r)
          for (std::size_t i = 0; i < total; ++i) o.want[i] += value<std::int64_t>(r, i, j);
        reqs.push_back(c.iallreduce(o.data.data(), total, reduce_op::sum));
      } else if (o.kind == 1) {
        o.in = values<std::int64_t>(c.rank(), total, j);
        o.data.assign(std::max<std::size_t>(1, o.counts[me]), -7);
        o.want.assign(o.counts[me], 0);
        for (int r = 0; r < c.size(); ++r)
          for (std::size_t i = 0; i < o.counts[me]; ++i) o.want[i] += value<std::int64_t>(r, mine_at + i, j);
        reqs.push_back(c.ireduce_scatter_v(o.in.data(), o.data.data(), o.counts.data(), reduce_op::sum));
      } else {
        o.data.assign(total, -1);
        o.want.resize(total);
        for (std::size_t b = 0, at = 0; b < ranks; at += o.counts[b], ++b)
          for (std::size_t i = 0; i < o.counts[b]; ++i) {
            o.want[at + i] = value<std::int64_t>(static_cast<int>(b), i, j);
            if (b == me) o.data[at + i] = o.want[at + i];
          }
        reqs.push_back(c.iallgather_v(o.data.data(), o.counts.data()));
      }
      if (j == ops / 2) {  // blocking ones among those in flight, as data_parallel does
        std::vector<std::size_t> n(ranks, 3);
        std::vector<std::int64_t> in(3 * ranks, 1), out(3, 0), gathered(3 * ranks, 0);
        c.reduce_scatter_v(in.data(), out.data(), n.data(), reduce_op::sum);
        k.expect(out[0] == c.size() && out[2] == c.size(), "a blocking reduce_scatter_v among pending operations");
        for (std::size_t i = 0; i < 3; ++i) gathered[3 * me + i] = c.rank();
        c.allgather_v(gathered.data(), n.data());
        for (std::size_t b = 0; b < ranks; ++b)
          k.expect(gathered[3 * b + 1] == static_cast<std::int64_t>(b), "a blocking allgather_v among pending operations");
      }
    }
    std::mt19937 g(static_cast<unsigned>(c.rank()) * 104729u + 5u);
    for (int polls = 0; polls < 300; ++polls) reqs[g() % ops].test();
    for (int j = ops - 1; j >= 0; --j) reqs[static_cast<std::size_t>(j)].wait();
    static constexpr const char* names[] = {"iallreduce", "ireduce_scatter_v", "iallgather_v"};
    for (int j = 0; j < ops; ++j) {
      one& o = all[static_cast<std::size_t>(j)];
      if (o.kind == 1) o.data.resize(o.counts[me]);
      k.equal(std::string(names[o.kind]) + " " + std::to_string(j) + " of " + std::to_string(o.want.size()), o.data, o.want);
    }
  });
}

TEST_CASE("hierarchical_comm names the setting that is wrong: the environment, or ranks that disagree",
          "[comm][hierarchical]") {
  auto world = loom::mpi_comm::world();
  ::setenv("LOOM_HIER_HOST_SIZE", "two", 1);
  CHECK_THROWS_WITH(loom::hierarchical_options::from_environment(), Catch::Contains("LOOM_HIER_HOST_SIZE='two'"));
  ::setenv("LOOM_HIER_HOST_SIZE", "2", 1);
  ::setenv("LOOM_HIER_VARIANT", "ring", 1);
  CHECK_THROWS_WITH(loom::hierarchical_options::from_environment(), Catch::Contains("LOOM_HIER_VARIANT='ring'"));
  ::setenv("LOOM_HIER_VARIANT", "leader", 1);
  const auto o = loom::hierarchical_options::from_environment();
  CHECK(o.ranks_per_host == 2);
  CHECK(o.variant == hierarchical_variant::leader);
  ::unsetenv("LOOM_HIER_HOST_SIZE");
  ::unsetenv("LOOM_HIER_VARIANT");
  CHECK_THROWS_AS(hierarchical_comm(world, {.ranks_per_host = -1}), loom::invalid_argument);
  if (world.size() > 1) {
    // Rank 0 asks for hosts of 2, the others for 1: every rank throws, none hangs.
    CHECK_THROWS_WITH(hierarchical_comm(world, {.ranks_per_host = world.rank() == 0 ? 2 : 1}),
                      Catch::Contains("different ranks_per_host"));
  }
  hierarchical_comm c(world, {.ranks_per_host = 2});
  CHECK_THROWS_WITH(c.split(-1, 0), Catch::Contains("hierarchical_comm::split") && Catch::Contains("rank " + std::to_string(world.rank())));
  world.barrier();
}

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto world = loom::mpi_comm::world();
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run() != 0 ? 1 : 0;
  const int mine = failed;
  world.allreduce(&failed, 1, loom::reduce_op::max);
  if (failed && !mine) std::fprintf(stderr, "test_comm_hier: rank %d passed, but another rank failed\n", world.rank());
  return failed;
}
