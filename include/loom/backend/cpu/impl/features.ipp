// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of features.hpp's functions: included at the end of the header (header-only),
// or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "loom/backend/cpu/features.hpp"
#include "loom/backend/cpu/impl/onednn.hpp"

namespace loom {

namespace detail {

/// oneDNN's name of a dnnl_cpu_isa_t value (oneDNN 2.x).
inline std::string onednn_isa_name(dnnl::cpu_isa isa) {
  switch (static_cast<dnnl_cpu_isa_t>(isa)) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: break;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "isa 0x%x", static_cast<unsigned>(isa));
  return hex;
}

}  // namespace detail

LOOM_DECL cpu_features detect_cpu_features() {
  cpu_features f;
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  bool have_model = false;
  while (std::getline(in, line) && (!have_model || flags.empty())) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && !have_model) f.model = value, have_model = true;
    if (key == "flags" && flags.empty()) flags = " " + value + " ";
  }
  const auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos; };
  f.avx2 = has("avx2") && has("fma");
  f.avx512 = has("avx512f") && has("avx512cd") && has("avx512bw") && has("avx512dq") && has("avx512vl");
  f.avx512_bf16 = f.avx512 && has("avx512_bf16");
  f.amx = has("amx_tile") && has("amx_bf16");
  f.onednn_isa = detail::onednn_isa_name(dnnl::get_effective_cpu_isa());
  for (const char* v : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"})
    if (const char* s = std::getenv(v); s && *s && f.onednn_limit.empty()) f.onednn_limit = std::string(v) + "=" + s;
  f.bf16 = detail::bf16_gemm::available();
  return f;
}


}  // namespace loom
