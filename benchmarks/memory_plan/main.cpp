// SPDX-License-Identifier: Apache-2.0
// loom::memory_plan against two measurements of one process training the example's mlp or cnn
// alone for 4 steps (Fashion-MNIST, SGD with momentum or Adam):
//   loom:  what loom's buffers hold at their peak (loom::host_memory, counted in host_space);
//   rss:   the process's peak resident set (VmHWM, reset through /proc/self/clear_refs before
//          the trainer is built) less its resident set then: loom's buffers and everything
//          else the run touches (oneDNN's primitives and scratchpads, OpenMP's threads, the
//          C library's heap, the data set's pages already being resident).
// One line per run: run it once per configuration (a fresh process each: a heap reused from an
// earlier run would hide growth). Usage: bench_memory_plan mlp|cnn BATCH [sgd|adam] [THREADS]

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "../../examples/common/networks.hpp"
#include "../common/bench.hpp"
#include "loom/loom.hpp"

namespace {

/// A field of /proc/self/status in bytes (VmRSS, VmHWM), 0 where it cannot be read.
std::size_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10) * 1024;
  return 0;
}

/// Starts a new peak resident set from the current one (Linux >= 4.0); false where it cannot.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out.flush());
}

template <class Net, class Optimizer, class Plan>
int run(const char* model, const char* optimizer, std::size_t batch, int threads, typename Optimizer::options opt) {
  const auto data = loom::data::fashion_mnist(loom::data::split::train).first(4 * batch);
  const std::size_t live = loom::host_memory().live_bytes;
  loom::reset_host_memory_peak();
  const bool rss_ok = reset_peak_rss();
  const std::size_t rss0 = status_bytes("VmRSS");
  {
    loom::trainer<Net, loom::softmax_cross_entropy, Optimizer> t{opt, {.seed = 1, .threads = threads}};
    loom::fit_options o;
    o.epochs = 1;
    o.batch = batch;
    o.progress = nullptr;
    t.fit(data, o);
  }
  const std::size_t loom_bytes = loom::host_memory().peak_bytes - live, rss = status_bytes("VmHWM") - rss0;
  const std::size_t plan = Plan::bytes_per_rank(batch);
  std::printf("model=%s optimizer=%s batch=%zu threads=%d plan_MB=%.2f loom_MB=%.2f loom/plan=%.4f rss_MB=%.2f%s "
              "rss/plan=%.3f\n",
              model, optimizer, batch, threads, plan / 1e6, loom_bytes / 1e6, double(loom_bytes) / double(plan), rss / 1e6,
              rss_ok ? "" : "(no reset)", double(rss) / double(plan));
  return 0;
}

template <class Net>
int with_optimizer(const char* model, const std::string& optimizer, std::size_t batch, int threads) {
  if (optimizer == "adam")
    return run<Net, loom::adam, loom::memory_plan<Net, loom::adam>>(model, "adam", batch, threads, {.lr = 1e-3f});
  return run<Net, loom::sgd, loom::memory_plan<Net, loom::sgd, loom::single_process, loom::with_momentum>>(
      model, "sgd", batch, threads, {.lr = 0.02f, .momentum = 0.9f});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_memory_plan mlp|cnn BATCH [sgd|adam] [THREADS]\n");
    return 2;
  }
  const std::string model = argv[1], optimizer = argc > 3 ? argv[3] : "sgd";
  const std::size_t batch = std::strtoull(argv[2], nullptr, 10);
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  bench::print_cpu_line();
  try {
    if (model == "cnn") return with_optimizer<example::cnn>("cnn", optimizer, batch, threads);
    return with_optimizer<example::mlp>("mlp", optimizer, batch, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory_plan: %s\n", e.what());
    return 1;
  }
}
