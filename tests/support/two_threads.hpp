// SPDX-License-Identifier: Apache-2.0
#pragma once
// A process_group of two ranks played by two threads of one process, for tests of what
// replicas exchange (a synchronized batch norm's sums) without MPI.

#include <algorithm>
#include <barrier>
#include <cstddef>
#include <thread>
#include <vector>

#include "loom/core/math_mode.hpp"
#include "loom/core/process_group.hpp"
#include "loom/layers/layer.hpp"  // loom::run_context

namespace loom::testing {

/// The two ranks of a group played by two threads: each allreduce_sum meets the other thread's
/// at a barrier, and both add the two contributions in rank order (in double), so both get the
/// same sums, as MPI's ranks do.
struct two_threads {
  std::barrier<> meet{2};
  std::vector<double> values[2];

  struct rank_of final : loom::process_group {
    rank_of(two_threads* group, int r) : g(group), me(r) {}
    two_threads* g;
    int me;
    int rank() const override { return me; }
    int size() const override { return 2; }
    void allreduce_sum(float* v, std::size_t n) override { sum(v, n); }
    void allreduce_sum(double* v, std::size_t n) override { sum(v, n); }
    template <class V>
    void sum(V* v, std::size_t n) {
      g->values[me].assign(v, v + n);
      g->meet.arrive_and_wait();
      for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<V>(g->values[0][i] + g->values[1][i]);
      g->meet.arrive_and_wait();  // neither writes its values again before both have read
    }
  };
  rank_of rank(int r) { return rank_of(this, r); }
};

/// Two replicas (halves[0], halves[1]: loom::model's of one network), each with its own half of
/// a batch of 2 * batch samples, synchronized through a two_threads group, one thread each: a
/// training forward (math m) and a backward from its half of dy. Returns the outputs, in order.
template <class Model, class T>
std::vector<T> train_halves(Model (&halves)[2], const std::vector<T>& x, const std::vector<T>& dy, std::size_t batch,
                            loom::math_mode m = loom::math_mode::fp32) {
  const std::size_t in = x.size() / (2 * batch), out = dy.size() / (2 * batch);
  two_threads group;
  std::vector<T> y(2 * batch * out);
  auto replica = [&](int r) {
    auto me = group.rank(r);
    loom::run_context ctx;
    ctx.math = m;
    ctx.replicas = &me;
    const T* yr = halves[r].forward(ctx, x.data() + r * batch * in, batch);
    std::copy(yr, yr + batch * out, y.begin() + static_cast<std::ptrdiff_t>(r * batch * out));
    halves[r].backward(ctx, dy.data() + r * batch * out, batch);
  };
  std::thread second(replica, 1);
  replica(0);
  second.join();
  return y;
}

}  // namespace loom::testing
