// SPDX-License-Identifier: Apache-2.0
// The Catch main of a test binary whose every case needs bf16 math on the CPU (oneDNN bf16
// primitives: AVX-512 and later). Where the CPU has it, the cases run as in any binary; where
// it lacks it (or oneDNN is limited below it, ONEDNN_MAX_CPU_ISA=AVX2), the binary says so and
// exits with 77, which CTest (SKIP_RETURN_CODE 77, see loom_test_requiring_bf16) reports as
// Skipped — never Passed without running, never Failed for lack of hardware. Listing the cases
// (catch_discover_tests) works on every CPU. tests/CMakeLists.txt's loom_test_requiring_bf16
// adds it to such a binary.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "loom/backend/cpu.hpp"
#include "loom/backend/cpu/features.hpp"

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  const auto& c = session.configData();
  const bool lists = c.showHelp || c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.libIdentify;
  if (!lists && !loom::cpu::supports(loom::math_mode::bf16)) {
    std::cout << argv[0] << ": this CPU has no bf16 (" << loom::detect_cpu_features().str() << "): skipped\n";
    return 77;
  }
  return session.run();
}
