// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the CPU loom runs on offers, in one line a test or a benchmark can print: the model, its
// vector ISA (AVX2, AVX-512, AMX, bf16 instructions), the ISA oneDNN dispatches to (after
// ONEDNN_MAX_CPU_ISA, which is how an AVX2-only CPU is emulated on a newer one) and whether
// math_mode::bf16 runs. A report, not a dispatcher: loom::cpu::supports() decides.

#include <string>

#include "loom/backend/cpu/gemm.hpp"
#include "loom/core/config.hpp"
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

/// The CPU loom runs on, read once per call (a file read and a oneDNN query: not for hot paths).
LOOM_DECL cpu_features detect_cpu_features();

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/features.ipp"
#endif
