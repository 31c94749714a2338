// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of sampler.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/monitor/sampler.hpp"

namespace loom::monitor {

LOOM_DECL process_sample sample_process() {
  process_sample s;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long size = 0, resident = 0;
    if (std::fscanf(f, "%lu %lu", &size, &resident) == 2)
      s.rss_bytes = static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) == 0) {
    s.peak_rss_bytes = static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux: KiB
    s.cpu_s = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
              1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  }
  return s;
}

LOOM_DECL std::optional<network_sample> parse_net_dev(const std::string& text) {
  network_sample s;
  std::size_t at = 0, line = 0, interfaces = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string l = text.substr(at, nl - at);
    at = nl + 1;
    if (line++ < 2) continue;
    const std::size_t colon = l.find(':');
    if (colon == std::string::npos) continue;
    std::string name = l.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    unsigned long long v[16] = {};
    if (std::sscanf(l.c_str() + colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                    &v[5], &v[6], &v[7], &v[8]) != 9)
      continue;
    ++interfaces;
    if (name == "lo") continue;
    s.received_bytes += static_cast<double>(v[0]);
    s.sent_bytes += static_cast<double>(v[8]);
  }
  if (interfaces == 0) return std::nullopt;
  return s;
}

LOOM_DECL std::optional<network_sample> sample_network() {
  std::FILE* f = std::fopen("/proc/net/dev", "r");
  if (!f) return std::nullopt;
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return parse_net_dev(text);
}

LOOM_DECL nvml::nvml(const std::string& pci_bus_id, unsigned index) {
  const char* path = std::getenv("LOOM_NVML_LIBRARY");
  lib_ = ::dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    why_ = std::string("NVML not loaded: ") + ::dlerror();
    return;
  }
  auto sym = [&](const char* name) { return ::dlsym(lib_, name); };
  init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  shutdown_ = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  by_index_ = reinterpret_cast<int (*)(unsigned, void**)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  by_pci_ = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  memory_ = reinterpret_cast<int (*)(void*, raw_memory*)>(sym("nvmlDeviceGetMemoryInfo"));
  utilization_ = reinterpret_cast<int (*)(void*, raw_utilization*)>(sym("nvmlDeviceGetUtilizationRates"));
  if (!init_ || !shutdown_ || !by_index_ || !memory_ || !utilization_) {
    why_ = "NVML lacks a function loom calls";
    close();
    return;
  }
  if (const int rc = init_(); rc != 0) {
    why_ = "nvmlInit_v2 returned " + std::to_string(rc);
    close();
    return;
  }
  initialised_ = true;
  const int rc = !pci_bus_id.empty() && by_pci_ ? by_pci_(pci_bus_id.c_str(), &device_) : by_index_(index, &device_);
  if (rc != 0) {
    why_ = "no NVML device " + (pci_bus_id.empty() ? std::to_string(index) : pci_bus_id) + " (" + std::to_string(rc) + ")";
    close();
  }
}

LOOM_DECL std::optional<device_sample> nvml::sample() const {
  if (!device_) return std::nullopt;
  raw_memory m{};
  raw_utilization u{};
  if (memory_(device_, &m) != 0 || utilization_(device_, &u) != 0) return std::nullopt;
  return device_sample{static_cast<double>(m.used), static_cast<double>(m.total), static_cast<double>(u.gpu)};
}

LOOM_DECL void nvml::close() {
  device_ = nullptr;
  if (initialised_) shutdown_();
  initialised_ = false;
  if (lib_) ::dlclose(lib_);
  lib_ = nullptr;
}

[[gnu::noinline]] LOOM_DECL void sampler::take(clock::time_point now) {
  machine_sample s;
  s.process = sample_process();
  s.network = sample_network();
  if (device_) s.device = device_->sample();
  const double dt = samples_ ? seconds_between(last_, now) : 0;
  if (dt > 0) {
    s.cpu_percent = 100.0 * (s.process.cpu_s - latest_.process.cpu_s) / dt;
    if (s.network && latest_.network) {
      s.received_bytes_per_s = std::max(0.0, s.network->received_bytes - latest_.network->received_bytes) / dt;
      s.sent_bytes_per_s = std::max(0.0, s.network->sent_bytes - latest_.network->sent_bytes) / dt;
    }
    const double compute = fig_->compute_s - compute_s_;
    s.gflops = compute > 0 ? (fig_->flops - flops_) / compute / 1e9 : 0;
  }
  compute_s_ = fig_->compute_s;
  flops_ = fig_->flops;
  if (timeline* t = current_timeline(); t && samples_ > 0) {
    t->sample(counter::rss_bytes, now, s.process.rss_bytes);
    t->sample(counter::peak_rss_bytes, now, s.process.peak_rss_bytes);
    t->sample(counter::cpu_percent, now, s.cpu_percent);
    if (s.network) {
      t->sample(counter::nic_received_bytes_per_s, now, s.received_bytes_per_s);
      t->sample(counter::nic_sent_bytes_per_s, now, s.sent_bytes_per_s);
    }
    if (s.device) {
      t->sample(counter::gpu_memory_bytes, now, s.device->memory_used_bytes);
      t->sample(counter::gpu_utilization_percent, now, s.device->utilization_percent);
    }
    t->sample(counter::gflops, now, s.gflops);
  }
  latest_ = s;
  last_ = now;
  ++samples_;
}
}  // namespace loom::monitor
