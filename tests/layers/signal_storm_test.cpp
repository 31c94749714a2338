// SPDX-License-Identifier: Apache-2.0
// oneDNN's JIT f32 GEMM kernels (up to oneDNN 3.11.0; Debian 12 ships 2.7) point the stack
// pointer into a heap workspace while they run. A signal that lands then has its frame written
// there by the kernel: the heap is corrupted and the process dies later in an unrelated free
// ("corrupted size vs. prev_size"), as loom's SIGTERM/SIGUSR1 checkpoint-and-stop did now and
// then (oneDNN issue #4845, fixed by its pull request #4855). loom keeps asynchronous signals
// away from the threads while they run oneDNN (backend/cpu/signals.hpp).
//
// This program is the regression test: a second thread sends SIGUSR1 — which this program
// handles — to the computing thread and to the process, thousands of times a second, while the
// computing thread runs loom's CPU GEMM on the example mlp's shapes and allocates around it.
// Every product must equal the first one bitwise (the frame would overwrite operands or
// results), the heap must survive (a corruption aborts in free), and the signals must have
// arrived (else nothing was tested). Exit status 0 on success, 1 on a wrong product.
// usage: test_cpu_signal_storm [threads] [seconds]

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/backend/cpu/features.hpp"

namespace {

std::atomic<long> handled{0};
extern "C" void on_usr1(int) { handled.fetch_add(1, std::memory_order_relaxed); }

struct product {
  std::size_t m, n, k;
  bool ta, tb;
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 4.0;
  loom::set_threads(threads);

  struct sigaction sa {};
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);

  // The mlp's products at batch 64: forward, backward-data, backward-weights of 784-256.
  const product shapes[] = {{64, 256, 784, false, true}, {64, 784, 256, false, false}, {256, 784, 64, true, false},
                            {64, 128, 256, false, true}, {128, 256, 64, true, false}};
  std::vector<std::vector<float>> a, b, want;
  for (const auto& s : shapes) {
    std::vector<float> x(s.m * s.k), y(s.k * s.n);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = float((i * 104729) % 997) / 997.0f - 0.5f;
    std::vector<float> c(s.m * s.n);
    loom::cpu::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, x.data(), s.ta ? s.m : s.k, y.data(), s.tb ? s.k : s.n, 0.0f,
                           c.data(), s.n);
    a.push_back(std::move(x));
    b.push_back(std::move(y));
    want.push_back(std::move(c));
  }

  const pthread_t computer = pthread_self();
  std::atomic<bool> stop{false};
  std::atomic<long> sent{0};
  std::thread storm([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      pthread_kill(computer, SIGUSR1);  // at the thread that runs the kernels
      ::kill(::getpid(), SIGUSR1);      // at the process: any thread, OpenMP's pool included
      sent.fetch_add(2, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });

  long products = 0, wrong = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (std::size_t i = 0; i < std::size(shapes); ++i) {
      const auto& s = shapes[i];
      // Fresh heap blocks around every product, so that a frame written into the heap meets
      // malloc's bookkeeping soon.
      auto c = std::make_unique<float[]>(s.m * s.n);
      std::vector<std::unique_ptr<char[]>> churn;
      for (int j = 0; j < 8; ++j) churn.push_back(std::make_unique<char[]>(64 + 512 * j));
      loom::cpu::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a[i].data(), s.ta ? s.m : s.k, b[i].data(),
                             s.tb ? s.k : s.n, 0.0f, c.get(), s.n);
      for (std::size_t j = 0; j < s.m * s.n; ++j)
        if (c[j] != want[i][j]) {
          if (wrong++ < 5)
            std::fprintf(stderr, "product %ld (%zux%zux%zu): element %zu is %g, expected %g\n", products, s.m, s.n, s.k, j,
                         double(c[j]), double(want[i][j]));
          break;
        }
      ++products;
    }
  }
  stop = true;
  storm.join();
  const long got = handled.load();
  std::printf("%s; %d thread(s): %ld products in %.1f s under %ld signals sent, %ld handled; %ld wrong\n",
              loom::detect_cpu_features().str().c_str(), threads, products, seconds, sent.load(), got, wrong);
  if (got < 1000) {
    std::printf("FAIL: only %ld signals were handled: the storm did not test anything\n", got);
    return 1;
  }
  if (wrong) {
    std::printf("FAIL: %ld products differ from the same product computed before the signals\n", wrong);
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
