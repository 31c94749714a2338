// SPDX-License-Identifier: Apache-2.0
// The cost of deterministic (split-invariant) mode, fit_options::deterministic_chunk: samples per
// second of the example's mlp and cnn under data_parallel<mpi_comm>, global batch 64 (--batch),
// with the mode off and with chunks of C (--chunk, default 16), 1 thread per rank. Paired, for a
// shared machine: one trainer per model runs rounds of two fit() calls of the same steps, one
// per mode, the order swapped every round, so that load from other processes hits both alike;
// it prints the median samples/s of each mode and the median of the per-round ratios.
//
//     mpirun -np 2 build/benchmarks/data_parallel/bench_deterministic_cost [--chunk 16] [--rounds 7]
//         [--steps-mlp 200] [--steps-cnn 20] [--batch 64] [--threads 1]

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
  std::size_t chunk = 16, rounds = 7, steps_mlp = 200, steps_cnn = 20, batch = 64;
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
  // samples/s of all ranks over one fit() of `n` more steps, on rank 0's clock.
  auto rate = [&](std::size_t chunk, std::size_t n) {
    o.deterministic_chunk = chunk;
    o.max_steps = t.steps() + n;
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = t.fit(train, o);
    return double(r.samples) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    else loom::mpi::abort(2, "bench_deterministic_cost: unknown flag " + a +
                                 " (--chunk, --rounds, --steps-mlp, --steps-cnn, --batch, --threads)");
  }
  try {
    const auto train = loom::data::mapped_fashion_mnist(loom::data::default_fashion_mnist_dir, loom::data::split::train);
    measure<mlp>("mlp", f, train, f.steps_mlp);
    measure<cnn>("cnn", f, train, f.steps_cnn);
  } catch (const loom::error& e) {
    loom::mpi::abort(1, std::string("bench_deterministic_cost: ") + e.what());
  }
  return 0;
}
