// SPDX-License-Identifier: Apache-2.0
// The question: does splitting the weight-gradient product of the layer that holds most
// of the gradient bytes into pieces, each piece's allreduce started as soon as it is computed,
// shorten the step? The main example's mlp (784-256-128-10) keeps 85% of its gradient in its
// first layer, whose backward (dW = dY^T X, 256 x 784 from a batch of 32 per rank) runs last,
// so its allreduce cannot overlap anything: data_parallel runs it blocking after backward.
//
// Under mpirun, every rank runs, per step, what that layer's backward and the gradient
// reduction cost, in one of these variants (interleaved step batch by step batch, the order
// reversed every other round):
//   pieces=1   the product whole (dnnl_sgemm, as loom's CPU backend), then one blocking
//              MPI_Allreduce over all the model's gradients (the first layer's and the
//              --other values of the layers after it): what data_parallel does for the mlp now.
//   pieces=k   the other layers' gradients posted first (MPI_Iallreduce: they are ready before
//              the first layer's backward), then the product in k blocks of rows; each block's
//              MPI_Iallreduce posted as it is done and MPI_Testall over everything in flight
//              (how loom lets MPI progress between a layer's pieces); the last block's
//              allreduce blocking, then MPI_Waitall.
// MPI_Iallreduce is libnbc's ring, which loom::mpi::environment makes the default.
// A `row:` line per (round, variant): the median step time, the median time after the last
// block was computed (what data_parallel counts as exposed communication), and the step time
// over pieces=1's in the same round (below 1: splitting pays).

#include <mpi.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/bench.hpp"
#include "loom/comm/mpi.hpp"

namespace {

struct options {
  int batch = 32, rows = 256, cols = 784, other = 34186;
  int steps = 400, rounds = 5, threads = 1;
  std::vector<int> pieces{1, 2, 4, 8, 16};
};

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: mpirun -np 2 bench_split_gradient [flags]\n"
               "  --batch N     samples per rank (default 32: the mlp's global batch 64 on 2 ranks)\n"
               "  --rows N      the layer's outputs (default 256)\n"
               "  --cols N      the layer's inputs (default 784)\n"
               "  --other N     gradient values of the layers after it (default 34186: the mlp's)\n"
               "  --pieces LIST blocks of rows to compute and reduce one by one (default 1,2,4,8,16; 1 first\n"
               "                is the base of the ratio and is added when missing)\n"
               "  --steps N     steps per timed batch (default 400)\n"
               "  --rounds N    rounds, every variant once per round (default 5)\n"
               "  --threads N   OpenMP threads of the product per rank (default 1)\n");
  std::exit(code);
}

int count_arg(const char* flag, const char* v) {
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (!v[0] || *end || n < 1 || n > (1 << 28)) {
    std::fprintf(stderr, "bench_split_gradient: %s needs a whole number >= 1, got '%s'\n", flag, v);
    std::exit(2);
  }
  return static_cast<int>(n);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(0);
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_split_gradient: %s needs a value\n", a.c_str());
      usage(2);
    }
    const char* v = argv[++i];
    if (a == "--batch") o.batch = count_arg("--batch", v);
    else if (a == "--rows") o.rows = count_arg("--rows", v);
    else if (a == "--cols") o.cols = count_arg("--cols", v);
    else if (a == "--other") o.other = count_arg("--other", v);
    else if (a == "--steps") o.steps = count_arg("--steps", v);
    else if (a == "--rounds") o.rounds = count_arg("--rounds", v);
    else if (a == "--threads") o.threads = count_arg("--threads", v);
    else if (a == "--pieces") {
      o.pieces.clear();
      std::string s = v;
      for (std::size_t at = 0; at <= s.size();) {
        const std::size_t comma = std::min(s.find(',', at), s.size());
        const std::string one = s.substr(at, comma - at);
        o.pieces.push_back(count_arg("--pieces", one.c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "bench_split_gradient: unknown flag %s\n", a.c_str());
      usage(2);
    }
  }
  o.pieces.erase(std::remove(o.pieces.begin(), o.pieces.end(), 1), o.pieces.end());
  o.pieces.insert(o.pieces.begin(), 1);
  for (int k : o.pieces)
    if (o.rows % k != 0) {
      std::fprintf(stderr, "bench_split_gradient: --pieces %d does not divide --rows %d\n", k, o.rows);
      std::exit(2);
    }
  return o;
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "bench_split_gradient: %s failed (MPI error %d)\n", what, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

/// One step of variant k: the product in k blocks of rows, their reductions as described above.
/// Returns the seconds after the last block was computed.
double step(const options& o, int k, const float* dy, const float* x, float* g, std::vector<MPI_Request>& rq) {
  const std::size_t layer = static_cast<std::size_t>(o.rows) * static_cast<std::size_t>(o.cols);
  const int rows = o.rows / k;
  rq.clear();
  if (k > 1) check(MPI_Iallreduce(MPI_IN_PLACE, g + layer, o.other, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &rq.emplace_back()), "MPI_Iallreduce");
  for (int p = 0; p < k; ++p) {
    // Rows [p*rows, (p+1)*rows) of dW = dY^T X: dY is (batch, rows_total) row-major.
    float* out = g + static_cast<std::size_t>(p) * static_cast<std::size_t>(rows) * static_cast<std::size_t>(o.cols);
    if (dnnl_sgemm('T', 'N', rows, o.cols, o.batch, 1.0f, dy + p * rows, o.rows, x, o.cols, 0.0f, out, o.cols) != dnnl_success) {
      std::fprintf(stderr, "bench_split_gradient: dnnl_sgemm failed\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (k > 1 && p + 1 < k) {
      check(MPI_Iallreduce(MPI_IN_PLACE, out, rows * o.cols, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &rq.emplace_back()), "MPI_Iallreduce");
      int done = 0;
      check(MPI_Testall(static_cast<int>(rq.size()), rq.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    }
  }
  const auto t0 = bench::clock_type::now();
  if (k == 1) {
    check(MPI_Allreduce(MPI_IN_PLACE, g, static_cast<int>(layer) + o.other, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  } else {
    float* last = g + static_cast<std::size_t>(k - 1) * static_cast<std::size_t>(rows) * static_cast<std::size_t>(o.cols);
    check(MPI_Allreduce(MPI_IN_PLACE, last, rows * o.cols, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    check(MPI_Waitall(static_cast<int>(rq.size()), rq.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  return bench::since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  const options o = parse(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  omp_set_num_threads(o.threads);
  const std::size_t layer = static_cast<std::size_t>(o.rows) * static_cast<std::size_t>(o.cols);
  std::vector<float> dy(static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(o.rows)),
      x(static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(o.cols)), g(layer + static_cast<std::size_t>(o.other));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = 0.001f * static_cast<float>(i % 7);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 5);
  if (rank == 0) {
    bench::print_cpu_line();
    std::printf("# %d ranks, %d thread(s) each; dW (%d x %d) from a batch of %d per rank, plus %d other values: %.0f KiB "
                "of gradients; %d steps per batch, %d rounds\n",
                size, o.threads, o.rows, o.cols, o.batch, o.other, double((layer + o.other) * sizeof(float)) / 1024.0,
                o.steps, o.rounds);
  }
  std::vector<MPI_Request> rq;
  // Warm-up: every variant once.
  for (int k : o.pieces)
    for (int s = 0; s < 50; ++s) step(o, k, dy.data(), x.data(), g.data(), rq);
  std::vector<std::vector<double>> ratios(o.pieces.size()), steps_us(o.pieces.size()), exposed_us(o.pieces.size());
  for (int r = 0; r < o.rounds; ++r) {
    std::vector<double> round_step(o.pieces.size());
    for (std::size_t j = 0; j < o.pieces.size(); ++j) {
      const std::size_t v = r % 2 ? o.pieces.size() - 1 - j : j;
      std::vector<double> st(static_cast<std::size_t>(o.steps)), ex(static_cast<std::size_t>(o.steps));
      MPI_Barrier(MPI_COMM_WORLD);
      for (int s = 0; s < o.steps; ++s) {
        const auto t0 = bench::clock_type::now();
        ex[static_cast<std::size_t>(s)] = step(o, o.pieces[v], dy.data(), x.data(), g.data(), rq);
        st[static_cast<std::size_t>(s)] = bench::since(t0);
      }
      round_step[v] = bench::median(st) * 1e6;
      steps_us[v].push_back(round_step[v]);
      exposed_us[v].push_back(bench::median(ex) * 1e6);
    }
    for (std::size_t v = 0; v < o.pieces.size(); ++v) {
      ratios[v].push_back(round_step[v] / round_step[0]);
      if (rank == 0)
        std::printf("row: round=%d pieces=%d step_us=%.1f exposed_us=%.1f step_over_whole=%.3f\n", r + 1, o.pieces[v],
                    round_step[v], exposed_us[v].back(), ratios[v].back());
    }
  }
  if (rank == 0) {
    std::printf("\n%8s %12s %14s %18s\n", "pieces", "step_us", "exposed_us", "step / pieces=1");
    for (std::size_t v = 0; v < o.pieces.size(); ++v)
      std::printf("%8d %12.1f %14.1f %18.3f\n", o.pieces[v], bench::median(steps_us[v]), bench::median(exposed_us[v]),
                  bench::median(ratios[v]));
    std::printf("(medians over the rounds; step / pieces=1: the median of each round's ratio)\n");
  }
  return 0;
}
