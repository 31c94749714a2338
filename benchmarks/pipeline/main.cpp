// SPDX-License-Identifier: Apache-2.0
// Pipeline schedules measured: `mpirun -np 2 bench_pipeline [--steps N] [--repeats R] [--batch B]`
// trains a network of four 1024-wide layers (two per stage, equal work in each pass) on 2 stages with M = 1, 2, 4, 8
// micro-batches under GPipe and 1F1B, and prints per row the median samples/s, the measured
// bubble (each stage's time waiting on its neighbour / its training time) beside the theory
// (S-1)/(M+S-1), and each stage's peak activation bytes, with 1F1B's peak against GPipe's and
// the bound S/M, and the balance (the less busy stage's compute time / the busier one's: an
// imbalance adds to the less busy stage's wait beyond the schedule's bubble). The first row is
// the same network trained by one rank alone (the other idles) on the same batch: the speed-up
// the pipeline buys on 2 cores. Lines starting with "raw:" carry every run.

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../common/bench.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/loom.hpp"

namespace {

// Images of 1 x 32 x 32 flattened, then four 1024-wide layers, two per stage (cut before layer
// 5). The theory assumes every stage takes as long as the others in each pass, forward and
// backward alike: here both stages run two 1024 x 1024 products per sample forward and four
// backward (the first linear computes its input gradient too, for the flatten before it; a
// network starting with a linear would give the first stage 5 backward products to the
// second's 6 and 1.25x its forward, and GPipe, which runs all forwards and then all backwards,
// would wait for that difference on top of the bubble).
using net = loom::network<loom::input<1, 32, 32>, loom::flatten,
                          loom::linear<1024>, loom::relu, loom::linear<1024>, loom::relu,
                          loom::linear<1024>, loom::relu, loom::linear<1024>, loom::relu,
                          loom::linear<10>>;
constexpr std::size_t stages = 2;
using data_set = loom::data::labelled_images<loom::shape<1, 32, 32>, 10>;

data_set synthetic(std::size_t n) {
  std::mt19937 gen(7);
  std::vector<std::uint8_t> px(n * 1024), lb(n);
  for (auto& p : px) p = static_cast<std::uint8_t>(gen() & 0xff);
  for (auto& l : lb) l = static_cast<std::uint8_t>(gen() % 10);
  return data_set(std::move(px), std::move(lb), "synthetic 32 x 32 images");
}

struct options {
  std::size_t steps = 20, repeats = 3, batch = 256;
};

struct measured {
  double samples_per_s = 0;
  std::vector<double> bubble;     // per stage
  std::vector<double> peak_bytes;  // per stage
  double balance = 0;              // the less busy stage's compute time / the busier one's
};

using bench::median;

loom::fit_options fit_opts(const options& o) {
  loom::fit_options fo;
  fo.batch = o.batch;
  fo.max_steps = o.steps;
  fo.epochs = 1000;
  fo.progress = nullptr;
  return fo;
}

template <std::size_t M, class Schedule>
measured run_pipeline(const data_set& data, const options& o, const char* name) {
  using policy = loom::model_parallel<loom::pipeline<stages, loom::micro_batches<M>, Schedule, loom::cut_at<5>>, loom::mpi_comm>;
  std::vector<double> rates;
  measured out;
  out.bubble.assign(stages, 0);
  out.peak_bytes.assign(stages, 0);
  std::vector<std::vector<double>> bubbles(stages);
  std::vector<double> balances;
  for (std::size_t r = 0; r < o.repeats; ++r) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy> t({.lr = 0.01f, .momentum = 0.9f},
                                                                           {.seed = 1, .threads = 1});
    t.fit(data, [&] { auto f = fit_opts(o); f.max_steps = 2; return f; }());  // warm-up: primitives, buffers
    const auto fit = t.fit(data, fit_opts(o));
    rates.push_back(static_cast<double>(fit.samples) / fit.seconds);
    for (std::size_t s = 0; s < stages; ++s) {
      const auto& f = fit.figures[s];
      bubbles[s].push_back(f.seconds > 0 ? f.bubble_s / f.seconds : 0);
      out.peak_bytes[s] = f.peak_activation_bytes;
    }
    const double c0 = fit.figures[0].compute_s, c1 = fit.figures[1].compute_s;
    balances.push_back(std::max(c0, c1) > 0 ? std::min(c0, c1) / std::max(c0, c1) : 0);
    if (t.rank() == 0)
      std::printf("raw: schedule=%s micro_batches=%zu samples_per_s=%.1f bubble0=%.4f bubble1=%.4f peak0=%.0f peak1=%.0f "
                  "seconds=%.4f compute0=%.4f compute1=%.4f bubble_s0=%.4f bubble_s1=%.4f data0=%.4f wait0=%.4f wait1=%.4f\n",
                  name, M, rates.back(), bubbles[0].back(), bubbles[1].back(), out.peak_bytes[0], out.peak_bytes[1],
                  fit.seconds, fit.figures[0].compute_s, fit.figures[1].compute_s, fit.figures[0].bubble_s,
                  fit.figures[1].bubble_s, fit.figures[0].data_s, fit.figures[0].wait_s, fit.figures[1].wait_s);
  }
  out.samples_per_s = median(rates);
  for (std::size_t s = 0; s < stages; ++s) out.bubble[s] = median(bubbles[s]);
  out.balance = median(balances);
  return out;
}

double run_alone(const data_set& data, const options& o) {
  // One rank trains the whole network; the other waits at the barrier.
  std::vector<double> rates;
  auto world = loom::mpi_comm::world();
  if (world.rank() == 0) {
    for (std::size_t r = 0; r < o.repeats; ++r) {
      loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t({.lr = 0.01f, .momentum = 0.9f}, {.seed = 1, .threads = 1});
      t.fit(data, [&] { auto f = fit_opts(o); f.max_steps = 2; return f; }());
      const auto fit = t.fit(data, [&] { auto f = fit_opts(o); f.max_steps = o.steps + 2; return f; }());
      rates.push_back(static_cast<double>(fit.samples) / fit.seconds);
      std::printf("raw: schedule=alone micro_batches=1 samples_per_s=%.1f\n", rates.back());
    }
  }
  world.barrier();
  return median(rates);
}

std::size_t number(std::string_view flag, std::string_view text) {
  std::size_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v == 0)
    throw loom::invalid_argument("bench_pipeline: " + std::string(flag) + " needs a positive number, got '" +
                                 std::string(text) + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto world = loom::mpi_comm::world();
  try {
    options o;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string_view a = argv[i];
      if (a == "--steps") o.steps = number(a, argv[i + 1]);
      else if (a == "--repeats") o.repeats = number(a, argv[i + 1]);
      else if (a == "--batch") o.batch = number(a, argv[i + 1]);
      else throw loom::invalid_argument("bench_pipeline: unknown flag " + std::string(a) + " (--steps, --repeats, --batch)");
    }
    if (argc % 2 == 0) throw loom::invalid_argument("bench_pipeline: every flag needs a value (--steps, --repeats, --batch)");
    if (world.size() != static_cast<int>(stages))
      throw loom::invalid_argument("bench_pipeline: run it on " + std::to_string(stages) + " ranks (mpirun -np 2), not " +
                                   std::to_string(world.size()));
    if (o.batch % 8 != 0) throw loom::invalid_argument("bench_pipeline: --batch must be a multiple of 8 (M up to 8)");
    const data_set data = synthetic(o.batch * (o.steps + 2));
    const bool lead = world.rank() == 0;
    const double alone = run_alone(data, o);
    if (lead) bench::print_cpu_line();
    if (lead)
      std::printf("pipeline benchmark: 2 stages (1 rank, 1 thread each), network 1x32x32-flatten-1024-1024 | 1024-1024-10, global batch %zu, "
                  "%zu steps, median of %zu\n",
                  o.batch, o.steps, o.repeats);
    if (lead) std::printf("%-6s %2s  %10s  %8s  %8s %8s %8s %8s  %12s %12s  %10s %5s\n", "sched", "M", "samples/s", "vs_alone",
                          "bubble0", "bubble1", "theory", "balance", "peak_act0_B", "peak_act1_B", "1f1b/gpipe", "S/M");
    if (lead) std::printf("%-6s %2d  %10.0f  %8.2f\n", "alone", 1, alone, 1.0);
    auto row = [&](const char* name, std::size_t m, const measured& r, double peak_ratio) {
      if (!lead) return;
      const double theory = double(stages - 1) / double(m + stages - 1);
      std::printf("%-6s %2zu  %10.0f  %8.2f  %8.3f %8.3f %8.3f %8.3f  %12.0f %12.0f", name, m, r.samples_per_s,
                  r.samples_per_s / alone, r.bubble[0], r.bubble[1], theory, r.balance, r.peak_bytes[0], r.peak_bytes[1]);
      if (peak_ratio >= 0) std::printf("  %10.3f %5.3f", peak_ratio, double(stages) / double(m));
      std::printf("\n");
    };
    auto both = [&]<std::size_t M>(std::integral_constant<std::size_t, M>) {
      const measured g = run_pipeline<M, loom::gpipe>(data, o, "gpipe");
      const measured f = run_pipeline<M, loom::one_f_one_b>(data, o, "1f1b");
      double ratio = 0;
      for (std::size_t s = 0; s < stages; ++s) ratio = std::max(ratio, g.peak_bytes[s] > 0 ? f.peak_bytes[s] / g.peak_bytes[s] : 0);
      row("gpipe", M, g, -1);
      row("1f1b", M, f, ratio);
      std::fflush(stdout);
    };
    both(std::integral_constant<std::size_t, 1>{});
    both(std::integral_constant<std::size_t, 2>{});
    both(std::integral_constant<std::size_t, 4>{});
    both(std::integral_constant<std::size_t, 8>{});
    return 0;
  } catch (const loom::error& e) {
    if (world.size() > 1) world.abort(1, std::string("bench_pipeline: ") + e.what());
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
