// SPDX-License-Identifier: Apache-2.0
// bf16 asked of a CPU without it: the trainer and cpu::gemm refuse with a message naming the way
// out. Run by CTest with ONEDNN_MAX_CPU_ISA=AVX2 (test_train.bf16_unsupported), which hides
// AVX-512 from oneDNN where the CPU has it: the same case runs on every CPU.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "loom/backend/cpu/features.hpp"
#include "loom/loom.hpp"

namespace {

using mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::linear<128>, loom::relu, loom::linear<10>>;

}  // namespace

TEST_CASE("bf16 on a CPU without oneDNN bf16 support throws invalid_argument naming the way out", "[.no_bf16]") {
  REQUIRE_FALSE(loom::cpu::supports(loom::math_mode::bf16));
  CHECK(loom::cpu::supports(loom::math_mode::fp32));
  using trainer = loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd>;
  CHECK_NOTHROW(trainer{{.lr = 0.02f}, {.seed = 1, .threads = 1}});
  auto make_bf16 = [] { trainer t{{.lr = 0.02f}, {.seed = 1, .threads = 1, .math = loom::math_mode::bf16}}; };
  CHECK_THROWS_AS(make_bf16(), loom::invalid_argument);
  CHECK_THROWS_WITH(make_bf16(), Catch::Contains("math_mode::bf16") && Catch::Contains("use math_mode::fp32"));
  std::vector<float> a(4, 1.0f), c(4, 0.0f);
  auto gemm_bf16 = [&] {
    loom::cpu::gemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, a.data(), 2, 0.0f, c.data(), 2, loom::math_mode::bf16);
  };
  CHECK_THROWS_AS(gemm_bf16(), loom::invalid_argument);
  CHECK_THROWS_WITH(gemm_bf16(), Catch::Contains("avx512_bf16") && Catch::Contains("math_mode::fp32"));
}

TEST_CASE("The CPU report names oneDNN's ISA limit and says bf16 math is off under it", "[.no_bf16]") {
  const auto f = loom::detect_cpu_features();
  INFO(f.str());
  CHECK(f.onednn_limit == "ONEDNN_MAX_CPU_ISA=AVX2");
  CHECK(f.onednn_isa == "avx2");
  CHECK_FALSE(f.bf16);
  CHECK(f.str().find("bf16 math no") != std::string::npos);
  CHECK_FALSE(f.model.empty());
}
