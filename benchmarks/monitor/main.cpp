// SPDX-License-Identifier: Apache-2.0
// What monitoring costs the training it watches: the example's mlp (SGD lr 0.02, momentum 0.9)
// on the real Fashion-MNIST through loom::trainer::fit, with every monitoring output on — the
// Prometheus textfile, JSON lines, TensorBoard events (all rewritten every --every seconds) and
// the Chrome trace timeline — against all of them off. Paired rounds: each round runs one fit
// of each, a fixed number of steps (sized to last about --seconds), in alternating order (on
// first in odd rounds), on the same trainer, so that drift and noise hit both alike; the
// figure is the median over rounds of the round's ratio on / off of samples per second; beside
// it the ratio off / on of the process's CPU seconds per fit call, which a busy machine
// (waiting for a core) does not inflate. One `round:` line per round
// and one `monitor:` line of medians on stdout, a `cpu:` line first.

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "../common/bench.hpp"
#include "loom/loom.hpp"

namespace {

struct options {
  std::size_t batch = 64, rounds = 15;
  int threads = 1;
  double seconds = 1, every_s = 1;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_monitor [--batch N] [--threads N] [--rounds N] [--seconds S] [--every S]\n"
               "  --every S  seconds between the metrics and TensorBoard writes (default 1; the trainer's default is 5)\n");
  std::exit(2);
}

template <class N>
N number(std::string_view flag, std::string_view text) {
  N v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size()) {
    std::fprintf(stderr, "bench_monitor: --%s needs a number, got '%s'\n", std::string(flag).c_str(),
                 std::string(text).c_str());
    usage();
  }
  return v;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view a = argv[i];
    if (a.substr(0, 2) != "--" || i + 1 >= argc) usage();
    const std::string_view name = a.substr(2), value = argv[i + 1];
    if (name == "batch") o.batch = number<std::size_t>(name, value);
    else if (name == "threads") o.threads = number<int>(name, value);
    else if (name == "rounds") o.rounds = number<std::size_t>(name, value);
    else if (name == "seconds") o.seconds = number<double>(name, value);
    else if (name == "every") o.every_s = number<double>(name, value);
    else usage();
  }
  if (o.batch == 0 || o.rounds == 0 || !(o.seconds > 0) || !(o.every_s >= 0)) usage();
  return o;
}

using trainer_type = loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd>;

struct run {
  double samples_per_s = 0;  ///< as fit measures it: the training steps
  double call_s = 0;         ///< the whole fit call: also the end-of-fit writes (trace, text summaries)
  double cpu_s = 0;          ///< CPU seconds of the process in the fit call (waiting for a busy core is not counted)
};

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  bench::print_cpu_line();
  const auto train = loom::data::fashion_mnist(loom::data::split::train);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom_bench_monitor_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);

  // One trainer for both: on and off differ only in their fit options.
  trainer_type trainer{{.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = o.threads}};
  loom::fit_options off;
  off.batch = o.batch;
  off.progress = nullptr;
  loom::fit_options on = off;
  on.metrics.prometheus_file = (dir / "loom.prom").string();
  on.metrics.jsonl_file = (dir / "loom.jsonl").string();
  on.metrics.tensorboard_dir = (dir / "tb").string();
  on.metrics.every_s = o.every_s;
  on.metrics.hparams = {{"model", std::string("mlp")}, {"batch", static_cast<double>(o.batch)}};
  on.trace = (dir / "trace.json").string();

  // A fit of `steps` more steps (max_steps counts over all of a trainer's fits).
  auto fit = [&](loom::fit_options fo, std::size_t steps) {
    trainer_type& t = trainer;
    fo.epochs = 1000;
    fo.max_steps = t.steps() + steps;
    const auto c0 = bench::cpu_snapshot::now();
    const auto r = t.fit(train, fo);
    const auto c1 = bench::cpu_snapshot::now();
    return run{r.samples_per_s(), std::chrono::duration<double>(c1.at - c0.at).count(), c1.own_s - c0.own_s};
  };
  // Warm-up (and sizing): 50 steps each, then the step count for --seconds.
  fit(off, 50);
  fit(on, 50);
  const run probe = fit(off, 200);
  const std::size_t steps =
      std::max<std::size_t>(20, static_cast<std::size_t>(o.seconds * probe.samples_per_s / static_cast<double>(o.batch)));

  std::vector<double> ratios, call_ratios, cpu_ratios, offs, ons;
  const auto c0 = bench::cpu_snapshot::now();
  for (std::size_t i = 0; i < o.rounds; ++i) {
    run a, b;
    const bool on_first = i % 2 == 1;
    if (on_first) {
      b = fit(on, steps);
      a = fit(off, steps);
    } else {
      a = fit(off, steps);
      b = fit(on, steps);
    }
    offs.push_back(a.samples_per_s);
    ons.push_back(b.samples_per_s);
    ratios.push_back(b.samples_per_s / a.samples_per_s);
    call_ratios.push_back(a.call_s / b.call_s);
    cpu_ratios.push_back(a.cpu_s / b.cpu_s);
    std::printf("round: i=%zu order=%s off_samples_per_s=%.0f on_samples_per_s=%.0f ratio=%.4f off_call_s=%.4f "
                "on_call_s=%.4f off_cpu_s=%.4f on_cpu_s=%.4f cpu_ratio=%.4f\n",
                i + 1, on_first ? "on-first" : "off-first", a.samples_per_s, b.samples_per_s, ratios.back(), a.call_s,
                b.call_s, a.cpu_s, b.cpu_s, cpu_ratios.back());
    std::fflush(stdout);
  }
  const auto c1 = bench::cpu_snapshot::now();
  const double ratio = bench::median(ratios);
  std::printf("monitor: model=mlp batch=%zu threads=%d rounds=%zu steps=%zu every_s=%g median_off_samples_per_s=%.0f "
              "median_on_samples_per_s=%.0f median_ratio=%.4f median_call_ratio=%.4f median_cpu_ratio=%.4f min_ratio=%.4f max_ratio=%.4f "
              "others_cores=%.2f target=0.99 verdict=%s\n",
              o.batch, o.threads, o.rounds, steps, o.every_s, bench::median(offs), bench::median(ons), ratio,
              bench::median(call_ratios), bench::median(cpu_ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()), bench::cpu_snapshot::others_cores(c0, c1),
              ratio >= 0.99 ? "meets" : "misses");
  std::filesystem::remove_all(dir);
  return 0;
}
