// SPDX-License-Identifier: Apache-2.0
// The cost of deterministic (split-invariant) mode, fit_options::deterministic_chunk: samples per
// second of the example's mlp and cnn under data_parallel<mpi_comm>, global batch 64 (--batch),
// with the mode off and with chunks of C (--chunk, default 16), 1 thread per rank. Paired, for a
// shared machine: one trainer per model runs rounds of two fit() calls of the same steps, one
// per mode, the order swapped every round, so that load from other processes hits both alike;
// it prints the median samples/s of each mode and the median of the per-round ratios, and the
// gradient bytes rank 0 sent per step in each mode. Any number of ranks (2, 3, 4, ...).
//
// Then the exchanges alone, on the gradient vector of each model: chunk_exchange (the mode's,
// the chunks of a global batch dealt as in training, their subtrees summed beforehand) against
// comm.allreduce (MPI_Allreduce, what the default mode's buckets run), paired the same way over
// --rounds rounds of --reps calls each: median milliseconds per call and the median ratio.
//
//     mpirun -np 2 build/benchmarks/data_parallel/bench_deterministic_cost [--chunk 16] [--rounds 7]
//         [--steps-mlp 200] [--steps-cnn 20] [--batch 64] [--threads 1] [--reps 50]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/bench.hpp"
#include "../../examples/common/networks.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/data/mapped.hpp"
#include "loom/loom.hpp"

namespace {

using mlp = example::mlp;
using cnn = example::cnn;

struct flags {
  std::size_t chunk = 16, rounds = 7, steps_mlp = 200, steps_cnn = 20, batch = 64, reps = 50;
  int threads = 1;
};

using bench::median;

template <class Net, class Dataset>
void measure(const char* name, const flags& f, const Dataset& train, std::size_t steps) {
  auto comm = loom::mpi_comm::world();
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::mpi_comm>> t{
      {.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = f.threads}};
  loom::fit_options o;
  o.epochs = std::size_t(1) << 40;  // bounded by max_steps
  o.batch = f.batch;
  o.progress = nullptr;
  double sent_per_step[2] = {0, 0};  // rank 0's gradient bytes per step, off / on
  // samples/s of all ranks over one fit() of `n` more steps, on rank 0's clock.
  auto rate = [&](std::size_t chunk, std::size_t n) {
    o.deterministic_chunk = chunk;
    o.max_steps = t.steps() + n;
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = t.fit(train, o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r.figures.empty() && r.steps > 0) sent_per_step[chunk ? 1 : 0] = r.figures[0].bytes_sent / double(r.steps);
    return double(r.samples) / s;
  };
  rate(0, std::max<std::size_t>(2, steps / 4));  // warm-up of both modes
  rate(f.chunk, std::max<std::size_t>(2, steps / 4));
  std::vector<double> off, on, ratio;
  for (std::size_t i = 0; i < f.rounds; ++i) {
    double a, b;
    if (i % 2 == 0) {
      a = rate(0, steps);
      b = rate(f.chunk, steps);
    } else {
      b = rate(f.chunk, steps);
      a = rate(0, steps);
    }
    off.push_back(a);
    on.push_back(b);
    ratio.push_back(b / a);
  }
  if (comm.rank() == 0)
    std::printf("%s: %d rank(s) x %d thread(s), batch %zu, %zu rounds of %zu steps per mode: off %.0f samples/s, "
                "chunk %zu %.0f samples/s (medians); with / without, median of the rounds %.2f (range %.2f-%.2f)\n",
                name, comm.size(), f.threads, f.batch, f.rounds, steps, median(off), f.chunk, median(on), median(ratio),
                *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()));
  if (comm.rank() == 0)
    std::printf("%s: gradient bytes rank 0 sent per step: off %.3f MB (as a ring allreduce counts them), chunk %zu "
                "%.3f MB (%.2fx); the vector is %.3f MB\n",
                name, sent_per_step[0] / 1e6, f.chunk, sent_per_step[1] / 1e6,
                sent_per_step[0] > 0 ? sent_per_step[1] / sent_per_step[0] : 0.0, Net::parameter_count * 4 / 1e6);
  std::fflush(stdout);
}

/// The exchanges alone on a gradient vector of `count` floats: chunk_exchange of the chunks of a
/// global batch of f.batch in chunks of f.chunk against comm.allreduce, paired rounds.
void exchanges(const char* name, const flags& f, std::size_t count) {
  auto comm = loom::mpi_comm::world();
  const auto plan = loom::chunk_plan::make(f.batch, f.chunk, static_cast<std::size_t>(comm.size()));
  const auto [first, last] = plan.chunks_of(static_cast<std::size_t>(comm.rank()), f.batch);
  std::vector<float> g(count, 1e-3f), out(count), flat(count);
  loom::gradient_tree<float, loom::cpu> mine;
  mine.reset(count, first);
  for (std::size_t k = first; k < last; ++k) mine.push(g.data());
  loom::chunk_exchange<float, loom::cpu> ex;
  double sent = 0;
  auto time_exchange = [&] {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < f.reps; ++i) sent = ex.run(comm, plan, f.batch, mine, out.data(), count);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(f.reps);
  };
  auto time_allreduce = [&] {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < f.reps; ++i) {
      std::copy(g.begin(), g.end(), flat.begin());  // as the exchange writes a fresh vector
      comm.allreduce(flat.data(), count, loom::reduce_op::sum);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(f.reps);
  };
  time_exchange();  // warm-up of both
  time_allreduce();
  std::vector<double> a, e, ratio;
  for (std::size_t i = 0; i < f.rounds; ++i) {
    double x, y;
    if (i % 2 == 0) {
      x = time_allreduce();
      y = time_exchange();
    } else {
      y = time_exchange();
      x = time_allreduce();
    }
    // Rank 0's clock; the slowest rank's time is what a step waits for.
    comm.allreduce(&x, 1, loom::reduce_op::max);
    comm.allreduce(&y, 1, loom::reduce_op::max);
    a.push_back(x);
    e.push_back(y);
    ratio.push_back(y / x);
  }
  if (comm.rank() == 0)
    std::printf("%s exchange: %d ranks, %zu floats (%.3f MB), %zu chunks of %zu (rank 0 holds %zu subtrees): "
                "allreduce %.3f ms, chunk_exchange %.3f ms (medians of %zu rounds of %zu calls, slowest rank); "
                "exchange / allreduce, median of the rounds %.2f (range %.2f-%.2f); rank 0 sent %.3f MB per "
                "exchange\n",
                name, comm.size(), count, count * 4 / 1e6, plan.chunks_per_batch, f.chunk, mine.subtrees(),
                median(a) * 1e3, median(e) * 1e3, f.rounds, f.reps, median(ratio),
                *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()),
                sent / 1e6);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) loom::mpi::abort(2, "bench_deterministic_cost: " + a + " needs a value");
    const std::size_t v = std::strtoull(argv[++i], nullptr, 10);
    if (v == 0) loom::mpi::abort(2, "bench_deterministic_cost: " + a + " needs a number of at least 1");
    if (a == "--chunk") f.chunk = v;
    else if (a == "--rounds") f.rounds = v;
    else if (a == "--steps-mlp") f.steps_mlp = v;
    else if (a == "--steps-cnn") f.steps_cnn = v;
    else if (a == "--batch") f.batch = v;
    else if (a == "--threads") f.threads = static_cast<int>(v);
    else if (a == "--reps") f.reps = v;
    else loom::mpi::abort(2, "bench_deterministic_cost: unknown flag " + a +
                                 " (--chunk, --rounds, --steps-mlp, --steps-cnn, --batch, --threads, --reps)");
  }
  try {
    if (loom::mpi_comm::world().rank() == 0) bench::print_cpu_line();
    const auto train = loom::data::mapped_fashion_mnist(loom::data::default_fashion_mnist_dir, loom::data::split::train);
    measure<mlp>("mlp", f, train, f.steps_mlp);
    measure<cnn>("cnn", f, train, f.steps_cnn);
    exchanges("mlp", f, mlp::parameter_count);
    exchanges("cnn", f, cnn::parameter_count);
  } catch (const loom::error& e) {
    loom::mpi::abort(1, std::string("bench_deterministic_cost: ") + e.what());
  }
  return 0;
}
