// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of half.hpp's x86 conversion and sum kernels (F16C, AVX2): included at the
// end of the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION;
// see loom/core/config.hpp). The one place loom includes <immintrin.h> for them.

#include <immintrin.h>

#include "loom/core/half.hpp"

namespace loom::detail {

__attribute__((target("avx,f16c"))) LOOM_DECL void fp16_from_float_f16c(const float* x, fp16* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = fp16::from_float(x[i]);
}
__attribute__((target("avx,f16c"))) LOOM_DECL void fp16_to_float_f16c(const fp16* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = x[i].to_float();
}
__attribute__((target("avx,f16c"))) LOOM_DECL void fp16_add_f16c(const fp16* a, fp16* b, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 s = _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))),
                                   _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + i), _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) b[i] = a[i] + b[i];
}
LOOM_DECL bool has_f16c() noexcept {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
// bf16 with AVX2: the same rounding as bf16_bits (to nearest even, NaN kept quiet), 8 at a time.
__attribute__((target("avx2"))) inline __m128i bf16_round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // 8 x 32 bits (each below 2^16) to 8 x 16: pack the two 128-bit lanes, then put them in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
__attribute__((target("avx2"))) inline __m256 bf16_load8(const bf16* x) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
__attribute__((target("avx2"))) LOOM_DECL void bf16_from_float_avx2(const float* x, bf16* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), bf16_round8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = bf16::from_float(x[i]);
}
__attribute__((target("avx2"))) LOOM_DECL void bf16_to_float_avx2(const bf16* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf16_load8(x + i));
  for (; i < n; ++i) y[i] = x[i].to_float();
}
__attribute__((target("avx2"))) LOOM_DECL void bf16_add_avx2(const bf16* a, bf16* b, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + i), bf16_round8(_mm256_add_ps(bf16_load8(a + i), bf16_load8(b + i))));
  for (; i < n; ++i) b[i] = a[i] + b[i];
}
LOOM_DECL bool has_avx2() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

}  // namespace loom::detail
