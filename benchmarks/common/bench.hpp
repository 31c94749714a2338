// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the benchmark programs share: wall-clock timing, the median, how busy the machine was
// with other work while they measured (a shared machine is noisy: every row says so), and the
// CPU they ran on (a table says which machine it is from).

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "loom/backend/cpu/features.hpp"

namespace bench {

using clock_type = std::chrono::steady_clock;

/// Seconds since t0.
inline double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

/// The median of v (the mean of the middle two for an even count; 0 for none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// CPU seconds all processes of the machine used (/proc/stat), this process's own (getrusage)
/// and its minor page faults, at one moment.
struct cpu_snapshot {
  double machine_busy_s = 0, own_s = 0, minflt = 0;
  clock_type::time_point at = clock_type::now();

  static cpu_snapshot now() {
    cpu_snapshot c;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double v[8] = {};
    if (stat >> cpu && cpu == "cpu")
      for (double& x : v) stat >> x;  // user nice system idle iowait irq softirq steal
    const double tick = double(::sysconf(_SC_CLK_TCK));
    c.machine_busy_s = (v[0] + v[1] + v[2] + v[5] + v[6]) / tick;
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    c.own_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    c.minflt = double(ru.ru_minflt);
    return c;
  }

  /// Cores other processes kept busy between a and b: the machine's CPU seconds less this
  /// process's own, per second of wall time. `own_s`: this job's CPU seconds in that time, when
  /// it is more than this process's (the other ranks of an mpirun on this machine); negative:
  /// this process's.
  static double others_cores(const cpu_snapshot& a, const cpu_snapshot& b, double own_s = -1) {
    const double wall = std::chrono::duration<double>(b.at - a.at).count();
    const double own = own_s >= 0 ? own_s : b.own_s - a.own_s;
    const double others = (b.machine_busy_s - a.machine_busy_s) - own;
    return wall > 0 ? std::max(0.0, others / wall) : 0.0;
  }
};

/// Prints `cpu: impl=loom <model>; <vector ISA>; oneDNN <ISA>; bf16 math yes|no`, the line
/// run.sh puts in its header. Call it once per program (on one rank).
inline void print_cpu_line() { std::printf("cpu: impl=loom %s\n", loom::detect_cpu_features().str().c_str()); }

}  // namespace bench
