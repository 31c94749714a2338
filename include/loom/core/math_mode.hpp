// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::math_mode: the precision matrix products and convolutions compute in, and the bf16
// rounding both backends and the tests agree on. Parameters, gradients, optimizer state and
// element-wise kernels are float whatever the mode; this file does not change storage.

#include <cstdint>
#include <cstring>

#include "loom/core/config.hpp"

namespace loom {

/// How a backend's matrix products (loom::linear) and convolutions (loom::conv2d) compute.
///   fp32: float operands, float accumulation (the default; loom's results before this option
///         existed, bit for bit).
///   bf16: mixed precision. The operands (activations, weights, output gradients) are rounded
///         to bfloat16 (8 exponent bits, 8 significant bits: about 2-3 decimal digits) as they
///         enter the product; products are summed in float and written as float. The master
///         weights, gradients, optimizer state and every element-wise layer stay float, so an
///         optimizer update smaller than bf16's resolution still changes the weights.
///         CPU: oneDNN bf16 primitives (AMX or AVX512-BF16 where present). CUDA: cuBLAS bf16
///         tensor cores; cuDNN convolutions run TF32 (see docs/gpu.md, "Mixed precision").
/// Applies to float networks; double (gradient checks) always computes in double.
enum class math_mode : std::uint8_t { fp32, bf16 };

/// "fp32" or "bf16".
constexpr const char* to_string(math_mode m) noexcept { return m == math_mode::bf16 ? "bf16" : "fp32"; }

namespace detail {
/// x rounded to the nearest bfloat16 (ties to even), returned as its 16 bits. NaN stays NaN
/// (quiet); infinities and overflow to infinity behave as IEEE rounding says.
LOOM_HD inline std::uint16_t bf16_bits(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
/// The float whose upper 16 bits are `bits` (exact).
LOOM_HD inline float bf16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
/// x rounded to bf16 precision and kept as a float: what a bf16 product sees of an operand.
LOOM_HD inline float round_to_bf16(float x) noexcept { return bf16_to_float(bf16_bits(x)); }
}  // namespace detail

}  // namespace loom
