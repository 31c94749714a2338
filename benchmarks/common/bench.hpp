// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the benchmark programs share: wall-clock timing, the median, how busy the machine was
// with other work while they measured (a shared machine is noisy: every row says so), and the
// CPU they ran on (a table says which machine it is from), and reading their flags.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <string>
#include <string_view>
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

/// A benchmark program's flags: `--name value` or `--name=value`, switches without a value, and
/// `--help`. Mistakes print "PROGRAM: message", the usage, and exit with status 2.
class flag_reader {
 public:
  flag_reader(const char* program, const char* usage) : program_(program), usage_(usage) {}

  [[noreturn]] void bad(const std::string& msg) const {
    std::cerr << program_ << ": " << msg << "\n\n" << usage_;
    std::exit(2);
  }

  /// `text` as a number of type N, the whole of it; else bad() naming --flag.
  template <class N>
  N number(std::string_view flag, std::string_view text) const {
    N v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || p != text.data() + text.size())
      bad("--" + std::string(flag) + " needs a number, got '" + std::string(text) + "'");
    return v;
  }

  /// The comma-separated items of `text` (empty items left out).
  static std::vector<std::string> list(std::string_view text) {
    std::vector<std::string> out;
    while (!text.empty()) {
      const auto comma = text.find(',');
      if (comma != 0) out.emplace_back(text.substr(0, comma));
      text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    }
    return out;
  }

  /// The comma-separated numbers of `text`, at least one; else bad() naming --flag.
  template <class N>
  std::vector<N> numbers(std::string_view flag, std::string_view text) const {
    std::vector<N> out;
    for (const auto& item : list(text)) out.push_back(number<N>(flag, item));
    if (out.empty()) bad("--" + std::string(flag) + " needs at least one value");
    return out;
  }

  /// Reads argv: `--help` or `-h` prints the usage and exits 0; each flag calls
  /// on_flag(name, value) (value empty for the names in `switches`), which returns false for
  /// a name it does not know.
  template <class OnFlag>
  void read(int argc, char** argv, std::initializer_list<std::string_view> switches, OnFlag on_flag) const {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        std::cout << usage_;
        std::exit(0);
      }
      if (a.substr(0, 2) != "--") bad("unexpected argument '" + std::string(a) + "'");
      std::string_view name = a.substr(2), value;
      if (auto eq = name.find('='); eq != std::string_view::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (std::find(switches.begin(), switches.end(), name) == switches.end()) {
        if (i + 1 >= argc) bad("--" + std::string(name) + " needs a value");
        value = argv[++i];
      }
      if (!on_flag(name, value)) bad("unknown flag --" + std::string(name));
    }
  }

 private:
  const char* program_;
  const char* usage_;
};

}  // namespace bench
