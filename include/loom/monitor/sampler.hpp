// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a rank's machine is doing, sampled about once a second while it trains: the process's
// resident and peak memory and CPU time (/proc/self/statm, getrusage: about a microsecond
// each), the host's network traffic (/proc/net/dev, loopback excluded: inside a network
// namespace, that namespace's interfaces), and on a GPU the device's memory and utilisation
// through NVML — loaded with dlopen when it is there (libnvidia-ml.so.1, or LOOM_NVML_LIBRARY),
// so loom neither links to it nor needs it: without it those fields stay empty and nothing
// fails. Also the machine's measured compute ceiling (monitor::measure_peak_gflops), against
// which the figures' achieved GFLOP/s are a share.

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/timeline.hpp"

namespace loom::monitor {

/// What the process uses, read in about a microsecond from /proc/self/statm and getrusage.
struct process_sample {
  double rss_bytes = 0;       ///< resident set now
  double peak_rss_bytes = 0;  ///< the most resident at once since the process started
  double cpu_s = 0;           ///< user + system CPU time of every thread
};

LOOM_DECL process_sample sample_process();

/// Bytes received and sent so far by the network interfaces this process sees, loopback
/// excluded; nullopt when /proc/net/dev cannot be read.
struct network_sample {
  double received_bytes = 0, sent_bytes = 0;
};

/// Parses /proc/net/dev's text: two header lines, then `name: rx_bytes rx_packets ... (8
/// receive fields) tx_bytes ...` per interface.
LOOM_DECL std::optional<network_sample> parse_net_dev(const std::string& text);

LOOM_DECL std::optional<network_sample> sample_network();

/// A GPU's memory in use and utilisation, as NVML reports them.
struct device_sample {
  double memory_used_bytes = 0, memory_total_bytes = 0;
  double utilization_percent = 0;  ///< share of the last sample period a kernel ran
};

/// NVML loaded at run time (dlopen), the few functions loom calls declared here as NVML's
/// header declares them. Without the library, or without a device, available() is false.
class nvml {
 public:
  /// Opens NVML (LOOM_NVML_LIBRARY, else libnvidia-ml.so.1) and initialises it; the device is
  /// the one with PCI bus id `pci_bus_id` (e.g. "0000:3b:00.0", as cudaDeviceGetPCIBusId
  /// writes it), or device `index` when the id is empty.
  explicit nvml(const std::string& pci_bus_id = "", unsigned index = 0);
  nvml(const nvml&) = delete;
  nvml& operator=(const nvml&) = delete;
  ~nvml() { close(); }

  bool available() const noexcept { return device_ != nullptr; }
  /// Why available() is false (empty when it is true).
  const std::string& why_not() const noexcept { return why_; }

  std::optional<device_sample> sample() const;

 private:
  struct raw_memory {  // nvmlMemory_t
    unsigned long long total, free, used;
  };
  struct raw_utilization {  // nvmlUtilization_t
    unsigned int gpu, memory;
  };
  void close();
  void* lib_ = nullptr;
  void* device_ = nullptr;
  bool initialised_ = false;
  std::string why_;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*by_index_)(unsigned, void**) = nullptr;
  int (*by_pci_)(const char*, void**) = nullptr;
  int (*memory_)(void*, raw_memory*) = nullptr;
  int (*utilization_)(void*, raw_utilization*) = nullptr;
};

/// One sample of everything: the process, the network (rates over the interval since the
/// previous sample), the device, and the compute rate over the same interval.
struct machine_sample {
  process_sample process;
  double cpu_percent = 0;  ///< CPU time over the interval, percent of one core
  std::optional<network_sample> network;
  double received_bytes_per_s = 0, sent_bytes_per_s = 0;
  std::optional<device_sample> device;
  double gflops = 0;  ///< FLOPs of the figures over the interval's compute seconds, in GFLOP/s
};

/// The 1 Hz sampler of one rank: tick() after every step costs one clock read, and samples
/// (a few microseconds) when `every_s` has passed since the last sample; each sample goes to
/// the calling thread's timeline as counters, when one records. latest() is what the metrics
/// files and the live view show.
class sampler {
 public:
  /// `fig`: the rank's figures (their FLOPs and compute seconds give the GFLOP/s); `device`:
  /// NVML's view of this rank's GPU, or null.
  explicit sampler(const rank_figures& fig, std::shared_ptr<const nvml> device = nullptr, double every_s = 1.0)
      : fig_(&fig), device_(std::move(device)), every_s_(every_s) {
    take(clock::now());
  }

  void tick() {
    const auto now = clock::now();
    if (seconds_between(last_, now) >= every_s_) take(now);
  }
  /// Samples now, whatever the time since the last.
  const machine_sample& sample_now() {
    take(clock::now());
    return latest_;
  }
  const machine_sample& latest() const noexcept { return latest_; }
  std::size_t samples() const noexcept { return samples_; }

 private:
  void take(clock::time_point now);

  const rank_figures* fig_;
  std::shared_ptr<const nvml> device_;
  double every_s_;
  machine_sample latest_;
  clock::time_point last_{};
  double compute_s_ = 0, flops_ = 0;
  std::size_t samples_ = 0;
};

/// The machine's compute ceiling for Backend in float, GFLOP/s: the best of square GEMMs of
/// `n` (2 n^3 FLOPs each) repeated for at least `seconds`, on the calling thread's settings
/// (its OpenMP threads, the device it computes on). Measured once per process and Backend
/// and remembered: about 0.1 s the first time.
template <class Backend>
double measure_peak_gflops(std::size_t n = 512, double seconds = 0.1) {
  static const double peak = [&] {
    using space = typename Backend::memory_space;
    // In host memory outside loom's buffers, so that the ceiling's scratch is not counted in
    // loom::host_memory's peak (the per-rank table compares that peak with the memory plan).
    struct host_matrix {
      explicit host_matrix(std::size_t k) : v(k) {}
      float* data() noexcept { return v.data(); }
      std::vector<float> v;
    };
    using matrix = std::conditional_t<space::host_accessible, host_matrix, buffer<float, space>>;
    matrix a(n * n), b(n * n), c(n * n);
    std::vector<float> host(n * n);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (auto* to : {&a, &b}) {
      if constexpr (space::host_accessible) std::copy(host.begin(), host.end(), to->data());
      else space::copy_from_host(to->data(), host.data(), host.size() * sizeof(float));
    }
    auto sync = [] {
      if constexpr (requires { Backend::synchronize(); }) Backend::synchronize();
    };
    Backend::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm up
    sync();
    double best = 0;
    const auto begin = clock::now();
    for (int k = 0; k < 3 || seconds_between(begin, clock::now()) < seconds; ++k) {
      const auto t0 = clock::now();
      Backend::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      sync();
      const double s = seconds_between(t0, clock::now());
      if (s > 0) best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s / 1e9);
      if (k > 1000) break;
    }
    return best;
  }();
  return peak;
}

}  // namespace loom::monitor

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/sampler.ipp"
#endif
