// SPDX-License-Identifier: Apache-2.0
#pragma once
// How the single-process training benchmarks time loom::trainer::fit: warm-up, then timed runs of
// a fixed number of steps, and their median samples per second.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "bench.hpp"
#include "loom/train/fit_options.hpp"

namespace bench {

/// How measure_fit warms up and sizes its timed runs.
struct fit_plan {
  std::size_t batch = 64;
  double warmup = 0.5;        ///< seconds of warm-up steps (and at least two chunks)
  double seconds = 2.0;       ///< length of one timed run, in seconds
  std::size_t repeats = 3;    ///< timed runs; the median is reported
  std::size_t first_chunk = 4;  ///< warm-up steps in the first chunk, doubling after each
  std::size_t max_chunk = 256;  ///< at most this many steps in one warm-up chunk
  std::size_t min_steps = 5;    ///< at least this many steps in one timed run
};

/// What measure_fit measured.
struct fit_rate {
  double median = 0;  ///< samples per second, the median of the timed runs
  std::vector<double> runs;
  std::size_t steps = 0;  ///< steps per timed run
  double train_loss = 0;  ///< the last run's
  double others_cores = 0;  ///< cores other processes kept busy during the timed runs
  double samples_per_cpu_s = 0;  ///< over the timed runs, per second of this process's CPU time
};

/// Samples per second of trainer `t` on `data`: warm-up chunks of steps until plan.warmup seconds
/// have passed, and at least two chunks (the first pays one-time set-up); the last chunk's rate
/// sizes the timed runs, each one whole fit(max_steps) call (loader set-up and batch gathering
/// included, as they are part of training).
template <class Trainer, class Dataset>
fit_rate measure_fit(Trainer& t, const Dataset& data, const fit_plan& plan) {
  loom::fit_options fo;
  fo.epochs = std::size_t(1) << 40;  // bounded by max_steps
  fo.batch = plan.batch;
  fo.progress = nullptr;
  fit_rate r;
  // Runs exactly n more steps; returns samples per second and adds the samples to *samples.
  auto run_steps = [&](std::size_t n, std::size_t* samples = nullptr) {
    fo.max_steps = t.steps() + n;
    const auto t0 = clock_type::now();
    const loom::fit_result fr = t.fit(data, fo);
    const double s = since(t0);
    r.train_loss = fr.train_loss;
    if (samples) *samples += fr.samples;
    return double(fr.samples) / s;
  };
  double rate = 0;
  const auto w0 = clock_type::now();
  std::size_t chunk = plan.first_chunk;
  for (int chunks = 0; chunks < 2 || since(w0) < plan.warmup; ++chunks) {
    rate = run_steps(chunk);
    chunk = std::min(chunk * 2, plan.max_chunk);
  }
  r.steps = std::max(plan.min_steps, std::size_t(std::llround(plan.seconds * rate / double(plan.batch))));
  const auto c0 = cpu_snapshot::now();
  std::size_t samples = 0;
  for (std::size_t i = 0; i < plan.repeats; ++i) r.runs.push_back(run_steps(r.steps, &samples));
  const auto c1 = cpu_snapshot::now();
  r.others_cores = cpu_snapshot::others_cores(c0, c1);
  r.samples_per_cpu_s = c1.own_s > c0.own_s ? double(samples) / (c1.own_s - c0.own_s) : 0.0;
  r.median = median(r.runs);
  return r;
}

}  // namespace bench
