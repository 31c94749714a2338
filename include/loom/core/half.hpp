// SPDX-License-Identifier: Apache-2.0
#pragma once
// 16-bit floats as storage for what goes over the wire: loom::bf16 (bfloat16: float's 8
// exponent bits, 8 significant bits) and loom::fp16 (IEEE 754 binary16: 5 exponent bits, 11
// significant bits). Conversions round to nearest, ties to even; arithmetic converts to float,
// computes there and rounds back — so a reduction over them sums in float at each step and
// carries 16 bits between steps (what loom::compress<> sends gradients in). Not a compute type:
// layers never see these.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "loom/core/config.hpp"
#include "loom/core/math_mode.hpp"

namespace loom {

/// bfloat16: the upper 16 bits of a float, rounded. Range as float's (about 3.4e38), 2-3
/// decimal digits.
struct bf16 {
  std::uint16_t bits = 0;
  static constexpr const char* name = "bf16";
  LOOM_HD static bf16 from_float(float x) noexcept { return {detail::bf16_bits(x)}; }
  LOOM_HD float to_float() const noexcept { return detail::bf16_to_float(bits); }
  LOOM_HD friend bf16 operator+(bf16 a, bf16 b) noexcept { return from_float(a.to_float() + b.to_float()); }
  LOOM_HD friend bool operator<(bf16 a, bf16 b) noexcept { return a.to_float() < b.to_float(); }
};

namespace detail {
/// x rounded to the nearest binary16 (ties to even), as its 16 bits: overflow to infinity,
/// subnormals kept, NaN stays NaN (quiet).
LOOM_HD inline std::uint16_t fp16_bits(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: rounds to infinity
  if (a < 0x38800000u) {                                                    // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);           // below half the smallest subnormal
    // In units of the smallest subnormal, 2^-24: mant x 2^(e - 150 + 24) = mant >> (126 - e),
    // e the float's biased exponent (102 ... 112 here, so the shift is 14 ... 24).
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);
    const std::uint32_t q = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    const std::uint32_t r = q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest even.
  std::uint32_t h = ((a >> 13) - (112u << 10));
  const std::uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: still right
  return static_cast<std::uint16_t>(sign | h);
}
/// The float equal to the binary16 `bits` (exact).
LOOM_HD inline float fp16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
  std::uint32_t u;
  if (e == 0x1fu) {
    u = sign | 0x7f800000u | (m << 13);  // infinity, NaN
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {  // subnormal: m x 2^-24, normalised
    int shift = 0;
    std::uint32_t mm = m;
    while (!(mm & 0x400u)) mm <<= 1, ++shift;
    u = sign | ((113u - static_cast<std::uint32_t>(shift)) << 23) | ((mm & 0x3ffu) << 13);
  }
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace detail

/// IEEE 754 binary16: range ±65504, 3-4 decimal digits, subnormals from 6e-8.
struct fp16 {
  std::uint16_t bits = 0;
  static constexpr const char* name = "fp16";
  LOOM_HD static fp16 from_float(float x) noexcept { return {detail::fp16_bits(x)}; }
  LOOM_HD float to_float() const noexcept { return detail::fp16_to_float(bits); }
  LOOM_HD friend fp16 operator+(fp16 a, fp16 b) noexcept { return from_float(a.to_float() + b.to_float()); }
  LOOM_HD friend bool operator<(fp16 a, fp16 b) noexcept { return a.to_float() < b.to_float(); }
};

namespace detail {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
// F16C (every x86-64 CPU with AVX2, and most with AVX) converts 8 fp16 values an instruction,
// AVX2 rounds 8 bf16 at once; the scalar paths above stay for other CPUs and for the tails.
// Chosen at run time: measured over shared memory, scalar conversions and sums made the mlp's
// compressed allreduce slower than float's.
// Defined in core/impl/half.ipp, the one place that includes <immintrin.h> (about 60,000 lines
// a translation unit need not parse under separate compilation).
__attribute__((target("avx,f16c"))) LOOM_DECL void fp16_from_float_f16c(const float* x, fp16* y, std::size_t n);
__attribute__((target("avx,f16c"))) LOOM_DECL void fp16_to_float_f16c(const fp16* x, float* y, std::size_t n);
__attribute__((target("avx,f16c"))) LOOM_DECL void fp16_add_f16c(const fp16* a, fp16* b, std::size_t n);
LOOM_DECL bool has_f16c() noexcept;
__attribute__((target("avx2"))) LOOM_DECL void bf16_from_float_avx2(const float* x, bf16* y, std::size_t n);
__attribute__((target("avx2"))) LOOM_DECL void bf16_to_float_avx2(const bf16* x, float* y, std::size_t n);
__attribute__((target("avx2"))) LOOM_DECL void bf16_add_avx2(const bf16* a, bf16* b, std::size_t n);
LOOM_DECL bool has_avx2() noexcept;
#else
inline bool has_f16c() noexcept { return false; }
inline bool has_avx2() noexcept { return false; }
inline void fp16_from_float_f16c(const float*, fp16*, std::size_t) {}
inline void fp16_to_float_f16c(const fp16*, float*, std::size_t) {}
inline void fp16_add_f16c(const fp16*, fp16*, std::size_t) {}
inline void bf16_from_float_avx2(const float*, bf16*, std::size_t) {}
inline void bf16_to_float_avx2(const bf16*, float*, std::size_t) {}
inline void bf16_add_avx2(const bf16*, bf16*, std::size_t) {}
#endif
}  // namespace detail

/// y[i] = x[i] rounded to H (host memory), for n values.
template <class H, class T>
void to_half(const T* x, H* y, std::size_t n) {
  if constexpr (std::is_same_v<H, fp16> && std::is_same_v<T, float>) {
    if (detail::has_f16c()) return detail::fp16_from_float_f16c(x, y, n);
  } else if constexpr (std::is_same_v<H, bf16> && std::is_same_v<T, float>) {
    if (detail::has_avx2()) return detail::bf16_from_float_avx2(x, y, n);
  }
  for (std::size_t i = 0; i < n; ++i) y[i] = H::from_float(static_cast<float>(x[i]));
}
/// y[i] = x[i] as T (exact for float), for n values.
template <class H, class T>
void from_half(const H* x, T* y, std::size_t n) {
  if constexpr (std::is_same_v<H, fp16> && std::is_same_v<T, float>) {
    if (detail::has_f16c()) return detail::fp16_to_float_f16c(x, y, n);
  } else if constexpr (std::is_same_v<H, bf16> && std::is_same_v<T, float>) {
    if (detail::has_avx2()) return detail::bf16_to_float_avx2(x, y, n);
  }
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<T>(x[i].to_float());
}
/// b[i] = a[i] + b[i], each sum in float and rounded to H.
template <class H>
void add_half(const H* a, H* b, std::size_t n) {
  if constexpr (std::is_same_v<H, fp16>) {
    if (detail::has_f16c()) return detail::fp16_add_f16c(a, b, n);
  } else {
    if (detail::has_avx2()) return detail::bf16_add_avx2(a, b, n);
  }
  for (std::size_t i = 0; i < n; ++i) b[i] = a[i] + b[i];
}

/// Whether T is one of loom's 16-bit wire floats.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<std::remove_cv_t<T>, bf16> || std::is_same_v<std::remove_cv_t<T>, fp16>;

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2 && std::is_trivially_copyable_v<bf16> &&
              std::is_trivially_copyable_v<fp16>);

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE) && defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
#include "loom/core/impl/half.ipp"
#endif
