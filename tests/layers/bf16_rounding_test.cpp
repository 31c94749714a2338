// SPDX-License-Identifier: Apache-2.0
// bf16 rounding as loom computes it in software, on any CPU: round_to_bf16 (what the reference
// and the checks of mixed_precision_test.cpp round with) and the rounding kernel loom::cuda runs
// before its products, through the CPU's launcher. No bf16 hardware involved.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gradient_check.hpp"
#include "loom/backend/cpu.hpp"
#include "loom/backend/kernels/bf16.hpp"
#include "loom/core/math_mode.hpp"

using namespace loom;

TEST_CASE("round_to_bf16 rounds to nearest with ties to even and keeps NaN and infinity", "[layers][bf16]") {
  using detail::bf16_bits;
  using detail::round_to_bf16;
  CHECK(bf16_bits(1.0f) == 0x3f80);
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);               // a tie: to the even neighbour (1.0)
  CHECK(round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);  // a tie: to the even neighbour above
  CHECK(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // above the tie: up
  CHECK(round_to_bf16(-3.0f) == -3.0f);
  CHECK(round_to_bf16(3.4e38f) == std::numeric_limits<float>::infinity());  // past bf16's largest (3.39e38): overflows
  CHECK(std::isinf(round_to_bf16(-std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits in the low bits only must not round into infinity.
  std::uint32_t u = 0x7f800001u;
  float snan;
  std::memcpy(&snan, &u, sizeof snan);
  CHECK(std::isnan(round_to_bf16(snan)));
}

TEST_CASE("The bf16 rounding kernel loom::cuda runs before its products makes compact copies of strided rows",
          "[layers][bf16]") {
  // The body loom::cuda launches, run here by the CPU's launcher: the same arithmetic.
  const std::size_t rows = 5, cols = 7, ld = 9;
  const auto v = loom::testing::random_values(rows * ld, 61, 3.0, 0.0);
  const std::vector<float> src(v.begin(), v.end());
  std::vector<std::uint16_t> dst(rows * cols, 0);
  cpu::for_each(rows * cols, kernels::round_to_bf16_rows{src.data(), dst.data(), cols, ld});
  std::size_t inexact = 0;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const float x = src[r * ld + c], y = detail::bf16_to_float(dst[r * cols + c]);
      CHECK(y == detail::round_to_bf16(x));
      CHECK(std::abs(y - x) <= std::abs(x) * 0x1p-8f);  // at most half a unit of the last of 8 bits
      inexact += y != x;
    }
  CHECK(inexact > rows * cols / 2);  // random floats are rarely bf16 already
}
