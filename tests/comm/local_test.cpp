// SPDX-License-Identifier: Apache-2.0
// What only local_comm promises: sums in rank order (bitwise reproducible), failures that end
// every rank's wait instead of hanging (a throwing rank, a returned rank, a deadlock), and
// disagreeing collectives reported to every rank.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/local.hpp"

using loom::local_comm;
using loom::local_world;
using loom::reduce_op;

namespace {

using clock_type = std::chrono::steady_clock;

/// Runs body on every rank of a world of n; returns each rank's communication_error message
/// ("" when it threw none). run()'s own exception is left to the caller.
template <class F>
std::vector<std::string> messages_of(int n, F body, std::exception_ptr* thrown = nullptr) {
  std::vector<std::string> messages(static_cast<std::size_t>(n));
  try {
    local_world(n).run([&](local_comm& c) {
      try {
        body(c);
      } catch (const loom::communication_error& e) {
        messages[static_cast<std::size_t>(c.rank())] = e.what();
        throw;
      }
    });
  } catch (...) {
    if (thrown) *thrown = std::current_exception();
  }
  return messages;
}

std::string what(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

}  // namespace

TEST_CASE("local_comm sums in rank order, so its results are bitwise reproducible", "[comm][local]") {
  // (1e8 + 1) - 1e8 is 0 in float; any other order of the three gives 1.
  const float parts[3] = {1e8f, 1.0f, -1e8f};
  constexpr std::size_t n = 300'001;  // several chunks, so several threads reduce it
  std::vector<std::vector<float>> all(3), scattered(3), nonblocking(3);
  local_world(3).run([&](local_comm& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<float> x(n, parts[r]);
    c.allreduce(x.data(), n, reduce_op::sum);
    all[r] = x;
    std::vector<float> in(3 * n, parts[r]), out(n);
    c.reduce_scatter(in.data(), out.data(), n, reduce_op::sum);
    scattered[r] = out;
    std::vector<float> y(n, parts[r]);
    c.iallreduce(y.data(), n, reduce_op::sum).wait();
    nonblocking[r] = y;
  });
  for (int r = 0; r < 3; ++r) {
    CHECK(std::count(all[r].begin(), all[r].end(), 0.0f) == static_cast<long>(n));
    CHECK(std::count(scattered[r].begin(), scattered[r].end(), 0.0f) == static_cast<long>(n));
    CHECK(std::count(nonblocking[r].begin(), nonblocking[r].end(), 0.0f) == static_cast<long>(n));
  }

  // Arbitrary floats, whose sum depends on the order: the same bits on every run and rank.
  auto run_once = [] {
    std::vector<std::vector<float>> out(4);
    local_world(4).run([&](local_comm& c) {
      std::vector<float> x(100'003);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i * 4 + c.rank() + 1) * 0.37f) * 1e3f / float(c.rank() + 1);
      c.allreduce(x.data(), x.size(), reduce_op::sum);
      out[static_cast<std::size_t>(c.rank())] = x;
    });
    return out;
  };
  const auto first = run_once();
  for (int k = 0; k < 3; ++k) {
    const auto again = run_once();
    for (int r = 0; r < 4; ++r) {
      CHECK(std::memcmp(again[r].data(), first[0].data(), first[0].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("local_world runs each local_comm rank on its own thread and rejects an empty world", "[comm][local]") {
  std::mutex m;
  std::set<std::thread::id> ids;
  std::vector<int> ranks, sizes;
  local_world(3).run([&](local_comm& c) {
    std::lock_guard lock(m);
    ids.insert(std::this_thread::get_id());
    ranks.push_back(c.rank());
    sizes.push_back(c.size());
  });
  CHECK(sizes == std::vector<int>{3, 3, 3});
  CHECK(ids.size() == 3);
  CHECK(ids.count(std::this_thread::get_id()) == 0);
  std::sort(ranks.begin(), ranks.end());
  CHECK(ranks == std::vector<int>{0, 1, 2});
  CHECK_THROWS_AS(local_world(0), loom::invalid_argument);
  CHECK(local_world(5).size() == 5);
}

TEST_CASE("When one local_comm rank throws, the others get communication_error naming it instead of hanging",
          "[comm][local]") {
  const auto start = clock_type::now();
  std::exception_ptr thrown;
  const auto messages = messages_of(4, [](local_comm& c) {
    std::vector<float> x(1000, 1.0f);
    switch (c.rank()) {
      case 2:
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        throw std::runtime_error("boom");
      case 1:
        c.recv(x.data(), x.size(), 2, 0);  // rank 2 never sends
        break;
      default:
        c.barrier();  // rank 2 never arrives
        break;
    }
  }, &thrown);
  CHECK(std::chrono::duration<double>(clock_type::now() - start).count() < 10.0);
  CHECK(what(thrown) == "boom");  // run() rethrows the first failure, as thrown
  for (int r : {0, 1, 3}) {
    INFO("rank " << r);
    CHECK(messages[r] == "local_comm: rank 2 failed: boom");
  }

  // In a sub-group, and while another rank waits on a non-blocking allreduce.
  const auto sub = messages_of(4, [](local_comm& c) {
    local_comm group = c.split(c.rank() % 2, c.rank());
    std::vector<double> x(500'000, 1.0);
    if (c.rank() == 3) throw std::logic_error("bad step");
    auto r = group.iallreduce(x.data(), x.size(), reduce_op::sum);  // rank 1 waits for rank 3
    r.wait();
  }, &thrown);
  CHECK(what(thrown) == "bad step");
  CHECK(sub[1] == "local_comm: rank 3 failed: bad step");
}

TEST_CASE("A local_comm request abandoned by an exception fails the run instead of hanging", "[comm][local]") {
  std::exception_ptr thrown;
  const auto messages = messages_of(3, [](local_comm& c) {
    std::vector<float> x(1000, 1.0f);
    if (c.rank() == 0) {
      auto r = c.iallreduce(x.data(), x.size(), reduce_op::sum);
      throw std::runtime_error("failed while reducing");  // r's destructor must not wait for ranks 1, 2
    }
    c.recv(x.data(), x.size(), 0, 7);  // rank 0 never sends; ranks 1, 2 never reach the iallreduce
  }, &thrown);
  CHECK(what(thrown) == "failed while reducing");
  for (int r : {1, 2}) {
    INFO("rank " << r);
    CHECK_THAT(messages[r], Catch::StartsWith("local_comm: rank 0 failed:"));
  }
}

TEST_CASE("A local_comm deadlock ends with communication_error naming what each rank waits for", "[comm][local]") {
  std::exception_ptr thrown;
  const auto messages = messages_of(2, [](local_comm& c) {
    std::vector<float> x(10, 1.0f);
    c.send(x.data(), x.size(), 1 - c.rank(), 0);  // both send first: neither receives
    c.recv(x.data(), x.size(), 1 - c.rank(), 0);
  }, &thrown);
  REQUIRE(thrown);
  for (int r : {0, 1}) {
    INFO("rank " << r);
    CHECK_THAT(messages[r], Catch::Contains("deadlock") && Catch::Contains("rank 0 waits in send to rank 1") &&
                                Catch::Contains("rank 1 waits in send to rank 0"));
  }
}

TEST_CASE("A local_comm rank waiting for one that has returned gets communication_error", "[comm][local]") {
  const auto messages = messages_of(3, [](local_comm& c) {
    std::vector<float> x(10, 1.0f);
    if (c.rank() == 0) return;
    if (c.rank() == 1) c.recv(x.data(), x.size(), 0, 1);
    if (c.rank() == 2) c.barrier();
  });
  CHECK_THAT(messages[1], Catch::Contains("rank 0") && Catch::Contains("returned"));
  // Rank 2 is told either that rank 0 returned or that rank 1 failed.
  CHECK_THAT(messages[2], Catch::StartsWith("local_comm"));
}

TEST_CASE("local_comm ranks that disagree on a collective all get communication_error saying how", "[comm][local]") {
  std::vector<std::string> root(3), count(3), kind(3), op(3);
  std::vector<int> after(3);
  local_world(3).run([&](local_comm& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<float> x(10, 1.0f);
    try {
      c.broadcast(x.data(), x.size(), c.rank());  // every rank names itself
    } catch (const loom::communication_error& e) {
      root[r] = e.what();
    }
    try {
      c.allreduce(x.data(), c.rank() == 1 ? 5 : 10, reduce_op::sum);
    } catch (const loom::communication_error& e) {
      count[r] = e.what();
    }
    try {
      if (c.rank() == 2)
        c.barrier();
      else
        c.allreduce(x.data(), x.size(), reduce_op::max);
    } catch (const loom::communication_error& e) {
      kind[r] = e.what();
    }
    try {
      c.allreduce(x.data(), x.size(), c.rank() == 0 ? reduce_op::max : reduce_op::sum);
    } catch (const loom::communication_error& e) {
      op[r] = e.what();
    }
    int one = 1;
    c.allreduce(&one, 1, reduce_op::sum);  // the communicator still works
    after[r] = one;
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(root[r] == "local_comm::broadcast: rank 0 names root 0 but rank 1 names root 1");
    CHECK(count[r] == "local_comm::allreduce: rank 0 passes 10 elements but rank 1 passes 5");
    CHECK_THAT(kind[r], Catch::Contains("rank 0 calls allreduce but rank 2 calls barrier") &&
                            Catch::Contains("same collectives in the same order"));
    CHECK(op[r] == "local_comm::allreduce: rank 0 asks for max but rank 1 for sum");
    CHECK(after[r] == 3);
  }
}

TEST_CASE("local_comm's test() completes an iallreduce without the other ranks waiting on it", "[comm][local]") {
  std::atomic<bool> completed{false};
  bool polled_alone = false;
  std::vector<float> result;
  local_world(2).run([&](local_comm& c) {
    std::vector<float> x(1'000'003, float(c.rank() + 1));
    auto r = c.iallreduce(x.data(), x.size(), reduce_op::sum);
    if (c.rank() == 0) {
      const auto deadline = clock_type::now() + std::chrono::seconds(10);
      while (!r.test() && clock_type::now() < deadline) {
      }
      polled_alone = !completed.load();
      completed = true;
      result = x;
    } else {
      // Rank 1 only waits once rank 0 has seen its request complete.
      const auto deadline = clock_type::now() + std::chrono::seconds(10);
      while (!completed && clock_type::now() < deadline) std::this_thread::yield();
      r.wait();
    }
  });
  CHECK(polled_alone);
  REQUIRE(result.size() == 1'000'003);
  CHECK(std::count(result.begin(), result.end(), 3.0f) == 1'000'003);
}
