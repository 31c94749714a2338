// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the CPU loom runs on offers, in one line a test or a benchmark can print: the model, its
// vector ISA (AVX2, AVX-512, AMX, bf16 instructions), the ISA oneDNN dispatches to (after
// ONEDNN_MAX_CPU_ISA, which is how an AVX2-only CPU is emulated on a newer one) and whether
// math_mode::bf16 runs. A report, not a dispatcher: loom::cpu::supports() decides.

#include <dnnl.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "loom/backend/cpu/gemm.hpp"
#include "loom/core/math_mode.hpp"

namespace loom {

/// The CPU as loom sees it. Flags come from /proc/cpuinfo (what the kernel, or a hypervisor,
/// lets programs use); the oneDNN fields from oneDNN itself.
struct cpu_features {
  std::string model = "unknown CPU";  ///< /proc/cpuinfo's "model name"
  bool avx2 = false;
  bool avx512 = false;       ///< AVX-512 F, CD, BW, DQ and VL (Skylake-SP and later, Zen 4)
  bool avx512_bf16 = false;  ///< AVX512-BF16 dot products (Cooper Lake, Sapphire Rapids, Zen 4)
  bool amx = false;          ///< AMX tiles with bf16 (Sapphire Rapids and later)
  std::string onednn_isa;    ///< the ISA oneDNN dispatches to, e.g. "avx512_core_bf16"
  std::string onednn_limit;  ///< "ONEDNN_MAX_CPU_ISA=AVX2" (or DNNL_MAX_CPU_ISA) when set, else empty
  bool bf16 = false;         ///< loom::cpu runs math_mode::bf16 (oneDNN has bf16 primitives)

  /// The vector ISA in words: "AVX-512 with avx512_bf16, no AMX", "AVX2, no AVX-512", ...
  std::string isa() const {
    std::string s = avx512 ? "AVX-512" : avx2 ? "AVX2, no AVX-512" : "no AVX2";
    if (avx512) s += avx512_bf16 ? " with avx512_bf16" : ", no avx512_bf16";
    if (avx2) s += amx ? ", AMX (amx_bf16)" : ", no AMX";
    return s;
  }
  /// One line: "Intel(R) Xeon(R) Processor; AVX-512 with avx512_bf16, no AMX; oneDNN
  /// avx512_core_bf16; bf16 math yes".
  std::string str() const {
    std::string s = model + "; " + isa() + "; oneDNN " + onednn_isa;
    if (!onednn_limit.empty()) s += " (limited by " + onednn_limit + ")";
    return s + "; bf16 math " + (bf16 ? "yes" : "no");
  }
};

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

/// The CPU loom runs on, read once per call (a file read and a oneDNN query: not for hot paths).
inline cpu_features detect_cpu_features() {
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
