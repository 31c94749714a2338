// SPDX-License-Identifier: Apache-2.0
#pragma once
// Runs a communicator test on every world of one binary: test_comm runs it on local_worlds of
// 1, 2, 3 and 4 threads; test_comm_mpi (LOOM_TEST_MPI) on MPI_COMM_WORLD of the processes
// mpirun started, once as is and once with chunked counts. Each rank records its own
// mismatches in a `checker` (Catch2 assertions are not thread-safe), reported afterwards.

#include <catch2/catch.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

#if LOOM_TEST_HIER
#include "loom/comm/hierarchical.hpp"
#elif LOOM_TEST_MPI
#include "loom/comm/mpi.hpp"
#else
#include "loom/comm/local.hpp"
#endif

namespace comm_test {

/// One rank's record of what did not match.
struct checker {
  int rank = 0;
  std::vector<std::string> failures;

  void fail(std::string what) {
    if (failures.size() < 16) failures.push_back(std::move(what));
  }

  void expect(bool ok, const std::string& what) {
    if (!ok) fail(what);
  }

  /// Element-by-element equality; reports the first difference.
  template <class T>
  void equal(const std::string& what, const T* got, const T* want, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (!(got[i] == want[i])) {
        std::ostringstream s;
        s << what << ": element " << i << " of " << n << " is " << +got[i] << " but the reference is " << +want[i];
        fail(s.str());
        return;
      }
    }
  }

  template <class T>
  void equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    if (got.size() != want.size()) {
      fail(what + ": " + std::to_string(got.size()) + " elements but the reference has " + std::to_string(want.size()));
      return;
    }
    equal(what, got.data(), want.data(), got.size());
  }

  /// f() must throw loom::communication_error whose message contains every one of `words`.
  template <class F>
  void throws(const std::string& what, F&& f, std::initializer_list<std::string_view> words = {}) {
    try {
      std::forward<F>(f)();
    } catch (const loom::communication_error& e) {
      const std::string_view text = e.what();
      for (const auto w : words)
        if (text.find(w) == std::string_view::npos)
          fail(what + ": the message '" + std::string(text) + "' does not mention '" + std::string(w) + "'");
      return;
    } catch (const std::exception& e) {
      fail(what + ": threw something other than loom::communication_error: " + e.what());
      return;
    }
    fail(what + ": did not throw");
  }
};

/// Reports one rank's failures to Catch2 (main thread only).
inline void report(const checker& k, const std::string& where) {
  for (const auto& f : k.failures) FAIL_CHECK(where << ", rank " << k.rank << ": " << f);
  CHECK(k.failures.empty());
}

/// The element counts every operation is checked on.
inline constexpr std::size_t sizes[] = {1, 7, 1'000'003};

/// A value for element i of rank `rank`, exact in every element type (|v| <= 50), so that sums
/// of up to a few thousand ranks are exact in any order.
template <class T>
T value(int rank, std::size_t i, int salt = 0) {
  const auto v = static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(salt) * 29) % 101);
  if constexpr (std::is_signed_v<T>) return static_cast<T>(v - 50);
  else return static_cast<T>(v);
}

template <class T>
std::vector<T> values(int rank, std::size_t n, int salt = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(rank, i, salt);
  return v;
}

/// The serial reference of a reduction: op over ranks 0, 1, ..., size-1 in order.
template <class T>
T reduce(T a, T b, loom::reduce_op op) {
  return op == loom::reduce_op::sum ? static_cast<T>(a + b) : (a < b ? b : a);
}

template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, std::uint64_t>) return "uint64";
  else if constexpr (std::is_same_v<T, char>) return "char";
  else return "T";
}

/// Calls f(std::type_identity<T>{}) for every T.
template <class... Ts, class F>
void for_types(F&& f) {
  (f(std::type_identity<Ts>{}), ...);
}

#if LOOM_TEST_HIER

/// The groupings test_comm_hier runs every test on: hosts of k consecutive ranks (0: by shared
/// memory, so one host here), each variant, counts split at INT_MAX or at 65536 elements (so
/// that 1,000,003 takes the chunked path).
struct hier_world {
  int ranks_per_host;
  loom::hierarchical_variant variant;
  std::size_t max_count;
};
inline constexpr hier_world hier_worlds[] = {
    {0, loom::hierarchical_variant::slice, INT_MAX},      {1, loom::hierarchical_variant::slice, INT_MAX},
    {2, loom::hierarchical_variant::slice, INT_MAX},      {2, loom::hierarchical_variant::leader, INT_MAX},
    {2, loom::hierarchical_variant::slice, 65536},        {2, loom::hierarchical_variant::leader, 65536},
    {3, loom::hierarchical_variant::slice, INT_MAX},      {3, loom::hierarchical_variant::leader, 65536},
};

/// Runs f(comm, checker) on every rank of a hierarchical_comm over MPI_COMM_WORLD, once per
/// grouping of hier_worlds. An unexpected exception ends the whole job.
template <class F>
void on_every_world(F&& f) {
  for (const hier_world& w : hier_worlds) {
    loom::hierarchical_comm c(loom::mpi_comm::world().with_max_count(w.max_count),
                              {.variant = w.variant, .ranks_per_host = w.ranks_per_host});
    checker k;
    k.rank = c.rank();
    try {
      f(c, k);
      c.barrier();
    } catch (const std::exception& e) {
      loom::mpi::abort(3, std::string("unexpected exception in '") +
                              Catch::getResultCapture().getCurrentTestName() + "': " + e.what());
    }
    report(k, "hierarchical_comm of " + std::to_string(c.size()) + " processes, " + std::to_string(w.ranks_per_host) +
                  " ranks per host, " + loom::to_string(c.mode()) + ", max_count " + std::to_string(w.max_count));
  }
}

#elif LOOM_TEST_MPI

/// Runs f(comm, checker) on every rank of MPI_COMM_WORLD with counts split at INT_MAX (so not
/// at all here) and at 65536 elements (so that 1,000,003 takes the chunked path). An
/// unexpected exception ends the whole job: the other ranks could otherwise wait forever.
template <class F>
void on_every_world(F&& f) {
  for (const std::size_t max_count : {static_cast<std::size_t>(INT_MAX), std::size_t{65536}}) {
    auto c = loom::mpi_comm::world().with_max_count(max_count);
    checker k;
    k.rank = c.rank();
    try {
      f(c, k);
      c.barrier();
    } catch (const std::exception& e) {
      loom::mpi::abort(3, std::string("unexpected exception in '") +
                              Catch::getResultCapture().getCurrentTestName() + "': " + e.what());
    }
    report(k, "mpi_comm of " + std::to_string(c.size()) + " processes, max_count " + std::to_string(max_count));
  }
}

#else

/// Runs f(comm, checker) on every rank of local_worlds of 1, 2, 3 and 4 threads.
template <class F>
void on_every_world(F&& f) {
  for (const int n : {1, 2, 3, 4}) {
    loom::local_world world(n);
    std::vector<checker> ks(static_cast<std::size_t>(n));
    world.run([&](loom::local_comm& c) {
      auto& k = ks[static_cast<std::size_t>(c.rank())];
      k.rank = c.rank();
      f(c, k);
    });
    for (const auto& k : ks) report(k, "local_world of " + std::to_string(n));
  }
}

#endif

}  // namespace comm_test
