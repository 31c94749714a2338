// SPDX-License-Identifier: Apache-2.0
// nccl_comm under mpirun, one GPU per rank: every collective and point-to-point operation on
// GPU memory gives what MPI would, host memory goes through MPI, misuse is a
// communication_error, and data-parallel, pipeline (2 ranks; 2 replicas of it on 4 ranks) and
// tensor-parallel (2 ranks) training over NCCL match training alone.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

#include "loom/backend/cuda/memory.hpp"
#include "loom/comm/nccl.hpp"
#include "loom/core/memory.hpp"
#include "nccl_train.hpp"
#include "relative_error.hpp"

using namespace loom;

namespace {

nccl_comm& world() {
  static nccl_comm w = nccl_comm::world();
  return w;
}

template <class T>
buffer<T, cuda_space> on_gpu(const std::vector<T>& v) {
  buffer<T, cuda_space> b(v.size());
  cuda_space::copy_from_host(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

/// ||a - b|| / ||b|| in double (b nonzero).
double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}

template <class T>
std::vector<T> on_host(const buffer<T, cuda_space>& b) {
  std::vector<T> v(b.size());
  cuda_space::copy_to_host(v.data(), b.data(), b.size() * sizeof(T));
  return v;
}

}  // namespace

TEST_CASE("nccl_comm's collectives on GPU memory give every rank the reduced, gathered or broadcast values",
          "[nccl]") {
  auto& c = world();
  const int n = c.size(), r = c.rank();
  CHECK(c.name() == "nccl");
  constexpr std::size_t count = 1000;
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(r + 1) * static_cast<float>(i % 17);

  SECTION("allreduce sum and max") {
    auto b = on_gpu(mine);
    c.allreduce(b.data(), count, reduce_op::sum);
    auto m = on_gpu(mine);
    c.allreduce(m.data(), count, reduce_op::max);
    const auto s = on_host(b), x = on_host(m);
    for (std::size_t i = 0; i < count; ++i) {
      CHECK(s[i] == static_cast<float>(n * (n + 1) / 2) * static_cast<float>(i % 17));
      CHECK(x[i] == static_cast<float>(n) * static_cast<float>(i % 17));
    }
  }
  SECTION("iallreduce completes at wait, and test says so") {
    auto b = on_gpu(mine);
    auto req = c.iallreduce(b.data(), count, reduce_op::sum);
    req.wait();
    CHECK(req.test());
    CHECK(on_host(b)[16] == static_cast<float>(n * (n + 1) / 2) * 16.0f);
  }
  SECTION("broadcast from the last rank") {
    auto b = on_gpu(mine);
    c.broadcast(b.data(), count, n - 1);
    CHECK(on_host(b)[5] == static_cast<float>(n) * 5.0f);
  }
  SECTION("reduce_scatter and allgather") {
    std::vector<double> blocks(count * static_cast<std::size_t>(n));
    std::iota(blocks.begin(), blocks.end(), static_cast<double>(r));
    auto in = on_gpu(blocks);
    buffer<double, cuda_space> out(count);
    c.reduce_scatter(in.data(), out.data(), count, reduce_op::sum);
    const auto got = on_host(out);
    const double base = static_cast<double>(n) * (n - 1) / 2.0;
    for (std::size_t i = 0; i < count; i += 97)
      CHECK(got[i] == base + n * static_cast<double>(static_cast<std::size_t>(r) * count + i));
    std::vector<std::int32_t> one(3, r);
    auto g_in = on_gpu(one);
    buffer<std::int32_t, cuda_space> g_out(3 * static_cast<std::size_t>(n));
    c.allgather(g_in.data(), g_out.data(), 3);
    const auto all = on_host(g_out);
    for (int k = 0; k < n; ++k) CHECK(all[3 * static_cast<std::size_t>(k) + 2] == k);
  }
}

TEST_CASE("nccl_comm's point-to-point operations pass a ring and a self-message without deadlock", "[nccl]") {
  auto& c = world();
  const int n = c.size(), r = c.rank();
  std::vector<float> mine(64, static_cast<float>(r));
  auto out = on_gpu(mine);
  buffer<float, cuda_space> in(64), self(64);
  auto s = c.isend(out.data(), 64, (r + 1) % n, 3);
  auto q = c.irecv(in.data(), 64, (r + n - 1) % n, 3);
  auto me_out = c.isend(out.data(), 64, r, 4);
  auto me_in = c.irecv(self.data(), 64, r, 4);
  s.wait();
  q.wait();
  me_out.wait();
  me_in.wait();
  CHECK(on_host(in)[63] == static_cast<float>((r + n - 1) % n));
  CHECK(on_host(self)[0] == static_cast<float>(r));
  if (n >= 2 && r < 2) {  // a blocking pair: rank 0 sends first, rank 1 receives first
    buffer<float, cuda_space> x(8);
    if (r == 0) {
      c.send(out.data(), 8, 1, 0);
      c.recv(x.data(), 8, 1, 0);
    } else {
      c.recv(x.data(), 8, 0, 0);
      c.send(out.data(), 8, 0, 0);
    }
    CHECK(on_host(x)[0] == static_cast<float>(1 - r));
  }
}

TEST_CASE("nccl_comm takes host memory through MPI and rejects mixed buffers", "[nccl]") {
  auto& c = world();
  double sums[2] = {1.0, static_cast<double>(c.rank())};
  c.allreduce(sums, 2, reduce_op::sum);  // host memory: MPI
  CHECK(sums[0] == c.size());
  std::vector<char> words(4 * static_cast<std::size_t>(c.size()));
  const char mine[4] = {'a', 'b', 'c', static_cast<char>('0' + c.rank())};
  c.allgather(mine, words.data(), 4);
  CHECK(words.back() == static_cast<char>('0' + c.size() - 1));
  buffer<float, cuda_space> d(4);
  std::vector<float> h(4 * static_cast<std::size_t>(c.size()));
  CHECK_THROWS_AS(c.allgather(d.data(), h.data(), 4), communication_error);
  CHECK_THROWS_WITH(c.broadcast(d.data(), 4, c.size()), Catch::Contains("root"));
  auto half = c.split(c.rank() % 2, 0);
  std::vector<float> one(4, 1.0f);
  auto b = on_gpu(one);
  half.allreduce(b.data(), 4, reduce_op::sum);
  CHECK(on_host(b)[0] == static_cast<float>(half.size()));
  c.barrier();
}

TEST_CASE("data_parallel<nccl_comm> training matches training alone on one GPU", "[nccl][train]") {
  const auto together = loom::cuda_tests::train_mlp_data_parallel(30);
  const auto alone = loom::cuda_tests::train_mlp_alone(30);
  const auto r = loom::testing::compare_relative(together, alone, 1e-2 * loom::testing::max_abs(std::span<const float>(alone)));
  INFO(r.str());
  CHECK(r.max_error <= 1e-4);
  world().barrier();
}

TEST_CASE("data_parallel<nccl_comm, shard_optimizer_state> (ZeRO) matches unsharded data parallelism", "[nccl][train][zero]") {
  const auto zero = loom::cuda_tests::train_mlp_zero(30);
  const auto plain = loom::cuda_tests::train_mlp_data_parallel_adam(30);
  const double d = relative_distance(zero, plain);
  INFO("relative distance " << d);
  // On 2 ranks the reduce-scatter adds the same two values as the allreduce.
  if (world().size() == 2) CHECK(zero == plain);
  CHECK(d <= 1e-6);
  world().barrier();
}

TEST_CASE("A 2-stage pipeline over nccl_comm ends where one GPU does after 20 steps", "[nccl][train][pipeline]") {
  if (world().size() != 2) {
    WARN("the pipeline case needs 2 ranks (mpirun -np 2); this run has " << world().size());
    return;
  }
  const auto piped = loom::cuda_tests::train_mlp_pipeline(20);
  const auto alone = loom::cuda_tests::train_mlp_alone(20);
  const double d = relative_distance(piped, alone);
  INFO("relative distance " << d);
  CHECK(d <= 1e-5);
  world().barrier();
}

TEST_CASE("Two replicas of a 2-stage pipeline over nccl_comm end where one GPU does after 20 steps",
          "[nccl][train][pipeline][hybrid]") {
  if (world().size() != 4) {
    WARN("the hybrid pipeline case needs 4 ranks (mpirun -np 4); this run has " << world().size());
    return;
  }
  const auto piped = loom::cuda_tests::train_mlp_hybrid_pipeline(20);
  const auto alone = loom::cuda_tests::train_mlp_alone(20);
  const double d = relative_distance(piped, alone);
  INFO("relative distance " << d);
  CHECK(d <= 1e-5);
  world().barrier();
}

TEST_CASE("tensor_parallel<2> over nccl_comm ends where one GPU does after 20 steps", "[nccl][train][tensor]") {
  if (world().size() != 2) {
    WARN("the tensor-parallel case needs 2 ranks (mpirun -np 2); this run has " << world().size());
    return;
  }
  const auto split = loom::cuda_tests::train_tp_mlp_tensor_parallel(20);
  const auto alone = loom::cuda_tests::train_plain_mlp_alone(20);
  const double d = relative_distance(split, alone);
  INFO("relative distance " << d);
  CHECK(d <= 1e-5);
  world().barrier();
}
