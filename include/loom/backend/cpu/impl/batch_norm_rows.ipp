// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of batch_norm_rows.hpp: included at the end of the header (header-only), or
// compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).
//
// Each pass is one body (`unit`: the rows of one share) compiled three times, inside an OpenMP
// loop of a function with target attributes (AVX-512, AVX2 + FMA, none): the loop's outlined
// function keeps its parent's target, and the body, always inlined, vectorises for it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <omp.h>

#include "loom/backend/cpu/batch_norm_rows.hpp"
#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/backend/cpu/impl/onednn.hpp"
#include "loom/backend/cpu/launch.hpp"
#include "loom/core/math_mode.hpp"

namespace loom::detail::bn_rows {

enum class pass { sums, normalize, gradient_sums, input_gradient };

/// One pass's operands (which of them a pass reads: batch_norm_rows.hpp).
struct args {
  pass kind;
  batch_norm_rows_layout l;
  const float* x;
  const float* dy;
  // backward with a fused ReLU: forward's scale and shift (its gradient: where forward's
  // normalized(x) > 0, recomputed); null without one
  const float* relu_scale;
  const float* relu_shift;
  bool relu;  // normalize: with the ReLU after it
  const float* mean;
  const float* p0;  // normalize: scale; input_gradient: a
  const float* p1;  // shift; b
  const float* p2;  // -; d
  float* out;
  double* partials;
  std::uint16_t* out16 = nullptr;  // normalize, input_gradient: out rounded to bf16, when not null
};

/// Rows summed in float before they are added to a share's double sums.
inline constexpr std::size_t chunk = 64;

/// W floats as one GCC vector (W = 16: a zmm register under AVX-512, two ymm under AVX2, four
/// xmm otherwise); W = 1: a float, for a row's last values when they are not a multiple of 8.
template <std::size_t W>
struct lanes {
  using type [[gnu::vector_size(W * sizeof(float))]] = float;
};
template <>
struct lanes<1> {
  using type = float;
};
template <std::size_t W>
using vf = typename lanes<W>::type;

/// W 32-bit and W 16-bit unsigned lanes (W > 1), for the bf16 copies' rounding.
template <std::size_t W>
struct bits_lanes {
  using wide [[gnu::vector_size(W * sizeof(std::uint32_t))]] = std::uint32_t;
  using half [[gnu::vector_size(W * sizeof(std::uint16_t))]] = std::uint16_t;
};

/// W values rounded to bf16 (detail::bf16_bits, lane by lane) at out.
template <std::size_t W>
[[gnu::always_inline]] inline void store_bf16(std::uint16_t* out, const vf<W>& v) {
  if constexpr (W == 1) {
    *out = bf16_bits(v);
  } else {
    using vu = typename bits_lanes<W>::wide;
    using vh = typename bits_lanes<W>::half;
    vu u;
    std::memcpy(&u, &v, sizeof u);
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu r = (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded;  // NaN stays NaN (quiet)
    const vh h = __builtin_convertvector(r, vh);
    std::memcpy(out, &h, sizeof h);
  }
}

/// The rows of share u of `units` (a contiguous share of all rows), run by run: `next()` moves to
/// the next piece of one run, rows [first, last) of run `run`. (Loops, not callbacks: a lambda
/// would be a function of its own, compiled without the pass's target.)
struct unit_rows {
  const batch_norm_rows_layout& l;
  std::size_t r, end;
  std::size_t run = 0, first = 0, last = 0;
  unit_rows(const batch_norm_rows_layout& layout, std::size_t u, std::size_t units)
      : l(layout), r(layout.rows() * u / units), end(layout.rows() * (u + 1) / units) {}
  [[gnu::always_inline]] bool next() {
    r += last - first;
    if (r >= end) return false;
    run = r / l.spatial;
    first = r - run * l.spatial;
    last = std::min(l.spatial, first + (end - r));
    return true;
  }
};

// The column groups below take V * P values of a row at a time: P vectors of V floats (a row of
// 8, 16, 32 or 64 values in one group; wider or odd rows in groups of 64, 16, 8, then single
// values), their accumulators and per-channel operands held in registers over the rows. Rows
// r0 .. r1, `pitch` (the layout's block) apart.

/// Calls op.template operator()<V, P>(j0) over the column groups of a row of B values (B = 0:
/// `block` values, known at run time).
template <std::size_t B, class Op>
[[gnu::always_inline]] inline void for_column_groups(std::size_t block, Op& op) {
  if constexpr (B == 8) {
    op.template operator()<8, 1>(0);
  } else if constexpr (B != 0) {
    op.template operator()<16, B / 16>(0);
  } else {
    std::size_t j = 0;
    for (; j + 64 <= block; j += 64) op.template operator()<16, 4>(j);
    for (; j + 16 <= block; j += 16) op.template operator()<16, 1>(j);
    if (j + 8 <= block) op.template operator()<8, 1>(j), j += 8;
    for (; j < block; ++j) op.template operator()<1, 1>(j);
  }
}

/// v = forward's normalisation before its ReLU, (x - mean) scale + shift: one function, so that
/// backward's recomputation of where it was positive (a fused ReLU's gradient) gives forward's
/// bits, without reading forward's output. (Written through v: a vector returned by value
/// would change the ABI between the three targets.)
template <std::size_t V>
[[gnu::always_inline]] inline void normalized(vf<V>& v, const vf<V>& x, const vf<V>& mean, const vf<V>& scale,
                                              const vf<V>& shift) {
  v = (x - mean) * scale + shift;
}

template <std::size_t V, std::size_t P>
[[gnu::always_inline]] inline void add_to_double(const vf<V> (&v)[P], double* s) {
  for (std::size_t p = 0; p < P; ++p) {
    float t[V];
    std::memcpy(t, &v[p], sizeof t);
    for (std::size_t j = 0; j < V; ++j) s[p * V + j] += t[j];
  }
}

/// Sums of one run's rows [r0, r1) at v (its first row), x0 (sample 0's first pixel of these
/// channels): s += the sums of v - x0, q += of its square, in float over 64 rows at a time.
struct sums_columns {
  const float* v;
  const float* x0;
  std::size_t pitch, r0, r1;
  double* s;
  double* q;
  template <std::size_t V, std::size_t P>
  [[gnu::always_inline]] void operator()(std::size_t j0) const {
    vf<V> sh[P];
    for (std::size_t p = 0; p < P; ++p) std::memcpy(&sh[p], x0 + j0 + p * V, sizeof sh[p]);
    for (std::size_t c0 = r0; c0 < r1; c0 += chunk) {
      const std::size_t c1 = std::min(r1, c0 + chunk);
      vf<V> s1[P] = {}, s2[P] = {};
      for (std::size_t r = c0; r < c1; ++r) {
        const float* row = v + r * pitch + j0;
#pragma GCC unroll 4
        for (std::size_t p = 0; p < P; ++p) {
          vf<V> d;
          std::memcpy(&d, row + p * V, sizeof d);
          d -= sh[p];
          s1[p] += d;
          s2[p] += d * d;
        }
      }
      add_to_double<V, P>(s1, s + j0);
      add_to_double<V, P>(s2, q + j0);
    }
  }
};

/// Gradient sums of one run's rows: g = dy, or when Masked (a fused ReLU's gradient) dy where
/// forward's normalized(x) > 0; s += the sums of g, q += of g (x - mean).
template <bool Masked>
struct gradient_columns {
  const float* x;
  const float* dy;
  const float* mean;
  const float* scale;  // Masked: forward's
  const float* shift;
  std::size_t pitch, r0, r1;
  double* s;
  double* q;
  template <std::size_t V, std::size_t P>
  [[gnu::always_inline]] void operator()(std::size_t j0) const {
    vf<V> mu[P], sc[P], sh[P];
    for (std::size_t p = 0; p < P; ++p) {
      std::memcpy(&mu[p], mean + j0 + p * V, sizeof mu[p]);
      if constexpr (Masked) {
        std::memcpy(&sc[p], scale + j0 + p * V, sizeof sc[p]);
        std::memcpy(&sh[p], shift + j0 + p * V, sizeof sh[p]);
      }
    }
    for (std::size_t c0 = r0; c0 < r1; c0 += chunk) {
      const std::size_t c1 = std::min(r1, c0 + chunk);
      vf<V> s1[P] = {}, s2[P] = {};
      for (std::size_t r = c0; r < c1; ++r) {
        const std::size_t at = r * pitch + j0;
#pragma GCC unroll 4
        for (std::size_t p = 0; p < P; ++p) {
          vf<V> xv, g;
          std::memcpy(&xv, x + at + p * V, sizeof xv);
          std::memcpy(&g, dy + at + p * V, sizeof g);
          if constexpr (Masked) {
            vf<V> v;
            normalized<V>(v, xv, mu[p], sc[p], sh[p]);
            g = v > 0 ? g : vf<V>{};
          }
          s1[p] += g;
          s2[p] += g * (xv - mu[p]);
        }
      }
      add_to_double<V, P>(s1, s + j0);
      add_to_double<V, P>(s2, q + j0);
    }
  }
};

/// One run's rows of a pass over the elements, from element `at` (its first row), of the
/// channels from `ch`. normalize: y = normalized(x) with k0, k1 as scale and shift, then
/// max(y, 0) when Relu. input_gradient: dx = k0 g + k1 (x - mean) + k2, g = dy, or when Relu dy
/// where forward's normalized(x) > 0 (relu_scale, relu_shift). With Copy, what is written is
/// written rounded to bf16 at out16 too; without Float only there (out is null: nothing reads
/// the float values).
template <pass Kind, bool Relu, bool Copy, bool Float>
struct element_columns {
  const args& a;
  std::size_t at, ch, pitch, r0, r1;
  template <std::size_t V, std::size_t P>
  [[gnu::always_inline]] void operator()(std::size_t j0) const {
    vf<V> mu[P], k0[P], k1[P], k2[P], sc[P], sh[P];
    const std::size_t c = ch + j0;
    for (std::size_t p = 0; p < P; ++p) {
      std::memcpy(&mu[p], a.mean + c + p * V, sizeof mu[p]);
      std::memcpy(&k0[p], a.p0 + c + p * V, sizeof k0[p]);
      std::memcpy(&k1[p], a.p1 + c + p * V, sizeof k1[p]);
      if constexpr (Kind == pass::input_gradient) std::memcpy(&k2[p], a.p2 + c + p * V, sizeof k2[p]);
      if constexpr (Kind == pass::input_gradient && Relu) {
        std::memcpy(&sc[p], a.relu_scale + c + p * V, sizeof sc[p]);
        std::memcpy(&sh[p], a.relu_shift + c + p * V, sizeof sh[p]);
      }
    }
    for (std::size_t r = r0; r < r1; ++r) {
      const std::size_t i = at + r * pitch + j0;
#pragma GCC unroll 4
      for (std::size_t p = 0; p < P; ++p) {
        vf<V> x;
        std::memcpy(&x, a.x + i + p * V, sizeof x);
        if constexpr (Kind == pass::normalize) {
          vf<V> v;
          normalized<V>(v, x, mu[p], k0[p], k1[p]);
          if constexpr (Relu) v = v > 0 ? v : vf<V>{};
          if constexpr (Float) std::memcpy(a.out + i + p * V, &v, sizeof v);
          if constexpr (Copy) store_bf16<V>(a.out16 + i + p * V, v);
        } else {
          vf<V> g;
          std::memcpy(&g, a.dy + i + p * V, sizeof g);
          if constexpr (Relu) {
            vf<V> v;
            normalized<V>(v, x, mu[p], sc[p], sh[p]);
            g = v > 0 ? g : vf<V>{};
          }
          const vf<V> v = k0[p] * g + k1[p] * (x - mu[p]) + k2[p];
          if constexpr (Float) std::memcpy(a.out + i + p * V, &v, sizeof v);
          if constexpr (Copy) store_bf16<V>(a.out16 + i + p * V, v);
        }
      }
    }
  }
};

/// The sums of share u: its slice of partials (2C: the channels' sums of x - x0 and of its
/// square, x0 a channel's first value) overwritten.
template <std::size_t B>
[[gnu::always_inline]] inline void sums_unit(const args& a, std::size_t u, std::size_t units) {
  const batch_norm_rows_layout& l = a.l;
  const std::size_t c = l.channels, bk = B ? B : l.block, groups = l.groups();
  double* p = a.partials + u * 2 * c;
  std::fill_n(p, 2 * c, 0.0);
  for (unit_rows it(l, u, units); it.next();) {
    const std::size_t g = it.run % groups;
    const sums_columns op{a.x + it.run * l.spatial * bk, a.x + g * l.spatial * bk, bk, it.first, it.last, p + g * bk,
                          p + c + g * bk};
    for_column_groups<B>(bk, op);
  }
}

/// The gradient sums of share u: its slice of partials (2C: the channels' sums of g and of
/// g (x - mean)) overwritten.
template <std::size_t B, bool Masked>
[[gnu::always_inline]] inline void gradient_sums_unit(const args& a, std::size_t u, std::size_t units) {
  const batch_norm_rows_layout& l = a.l;
  const std::size_t c = l.channels, bk = B ? B : l.block, groups = l.groups();
  double* p = a.partials + u * 2 * c;
  std::fill_n(p, 2 * c, 0.0);
  for (unit_rows it(l, u, units); it.next();) {
    const std::size_t g = it.run % groups, at = it.run * l.spatial * bk;
    const gradient_columns<Masked> op{a.x + at,
                                      a.dy + at,
                                      a.mean + g * bk,
                                      Masked ? a.relu_scale + g * bk : nullptr,
                                      Masked ? a.relu_shift + g * bk : nullptr,
                                      bk,
                                      it.first,
                                      it.last,
                                      p + g * bk,
                                      p + c + g * bk};
    for_column_groups<B>(bk, op);
  }
}

/// Share u's rows of a pass over the elements (normalize, input_gradient).
template <std::size_t B, pass Kind, bool Relu, bool Copy, bool Float>
[[gnu::always_inline]] inline void elementwise_unit(const args& a, std::size_t u, std::size_t units) {
  const batch_norm_rows_layout& l = a.l;
  const std::size_t bk = B ? B : l.block, groups = l.groups();
  for (unit_rows it(l, u, units); it.next();) {
    const element_columns<Kind, Relu, Copy, Float> op{a, it.run * l.spatial * bk, it.run % groups * bk, bk, it.first, it.last};
    for_column_groups<B>(bk, op);
  }
}

template <std::size_t B, pass Kind, bool Relu>
[[gnu::always_inline]] inline void elementwise_unit_copy(const args& a, std::size_t u, std::size_t units) {
  if (!a.out16) elementwise_unit<B, Kind, Relu, false, true>(a, u, units);
  else if (a.out) elementwise_unit<B, Kind, Relu, true, true>(a, u, units);
  else elementwise_unit<B, Kind, Relu, true, false>(a, u, units);
}

/// Share u of pass a, for rows of B values (0: any).
template <std::size_t B>
[[gnu::always_inline]] inline void unit_of_block(const args& a, std::size_t u, std::size_t units) {
  const bool masked = a.relu_scale != nullptr;
  switch (a.kind) {
    case pass::sums: return sums_unit<B>(a, u, units);
    case pass::gradient_sums:
      return masked ? gradient_sums_unit<B, true>(a, u, units) : gradient_sums_unit<B, false>(a, u, units);
    case pass::normalize:
      return a.relu ? elementwise_unit_copy<B, pass::normalize, true>(a, u, units)
                    : elementwise_unit_copy<B, pass::normalize, false>(a, u, units);
    case pass::input_gradient:
      return masked ? elementwise_unit_copy<B, pass::input_gradient, true>(a, u, units)
                    : elementwise_unit_copy<B, pass::input_gradient, false>(a, u, units);
  }
}

/// The shares of a sum pass: as many as give each at least 64 values per channel (each share
/// writes 2C partial sums: fewer, larger shares where the activation has few pixels and many
/// channels), at most batch_norm_row_units; a function of the shape alone.
inline std::size_t sum_units(const batch_norm_rows_layout& l) {
  return std::clamp<std::size_t>(l.batch * l.spatial / 64, 1, batch_norm_row_units);
}

[[gnu::always_inline]] inline std::size_t units_of(const args& a) {
  if (a.kind == pass::sums || a.kind == pass::gradient_sums) return sum_units(a.l);
  return std::max<std::size_t>(batch_norm_row_units, 4 * static_cast<std::size_t>(omp_get_max_threads()));
}

[[gnu::always_inline]] inline void unit(const args& a, std::size_t u, std::size_t units) {
  switch (a.l.block) {
    case 8: return unit_of_block<8>(a, u, units);
    case 16: return unit_of_block<16>(a, u, units);
    case 32: return unit_of_block<32>(a, u, units);
    case 64: return unit_of_block<64>(a, u, units);
    default: return unit_of_block<0>(a, u, units);
  }
}

// The pass over every share, in parallel when the activation is large enough to pay for it.
#define LOOM_BN_ROWS_RUN(name, target)                                                      \
  target LOOM_DECL void name(const args& a) {                                               \
    const std::size_t units = units_of(a);                                                  \
    const auto n = static_cast<std::ptrdiff_t>(units);                                      \
    _Pragma("omp parallel for schedule(static) if (a.l.rows() * a.l.block >= parallel_threshold)") \
    for (std::ptrdiff_t u = 0; u < n; ++u) unit(a, static_cast<std::size_t>(u), units);     \
  }
LOOM_BN_ROWS_RUN(run_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,prefer-vector-width=512"))))
LOOM_BN_ROWS_RUN(run_avx2, __attribute__((target("avx2,fma"))))
LOOM_BN_ROWS_RUN(run_baseline, )
#undef LOOM_BN_ROWS_RUN

/// The widest of the three that oneDNN runs too (ONEDNN_MAX_CPU_ISA limits both) and the CPU has.
LOOM_DECL void run(const args& a) {
  if (a.l.rows() == 0) return;
  switch (cpu_vector_level()) {
    case 2: return run_avx512(a);
    case 1: return run_avx2(a);
    default: return run_baseline(a);
  }
}

/// A sum pass's shares added up in order (the same bits whatever ran them), into sums[0, 2C).
inline void add_shares(const double* partials, const batch_norm_rows_layout& l, double* sums) {
  const std::size_t c = l.channels, units = sum_units(l);
  std::copy_n(partials, 2 * c, sums);
  for (std::size_t u = 1; u < units; ++u)
    for (std::size_t k = 0; k < 2 * c; ++k) sums[k] += partials[u * 2 * c + k];
}

}  // namespace loom::detail::bn_rows

namespace loom::detail {

LOOM_DECL void batch_norm_rows_sums(const float* x, const batch_norm_rows_layout& l, double* partials, double* sums) {
  const std::size_t c = l.channels;
  const double n = static_cast<double>(l.batch * l.spatial);
  sums[2 * c] = n;
  if (l.rows() == 0) {
    std::fill_n(sums, 2 * c, 0.0);
    return;
  }
  bn_rows::run({bn_rows::pass::sums, l, x, nullptr, nullptr, nullptr, false, nullptr, nullptr, nullptr, nullptr, nullptr,
                partials, nullptr});
  bn_rows::add_shares(partials, l, sums);
  // From sums about x0 (each channel's first value) to sums about 0.
  for (std::size_t k = 0; k < c; ++k) {
    const double x0 = x[k / l.block * l.spatial * l.block + k % l.block], s = sums[k], q = sums[c + k];
    sums[k] = s + n * x0;
    sums[c + k] = q + 2 * x0 * s + n * x0 * x0;
  }
}

LOOM_DECL void batch_norm_rows_normalize(const float* x, const batch_norm_rows_layout& l, const float* mean,
                                         const float* scale, const float* shift, float* y, bool relu,
                                         std::uint16_t* y16) {
  if (!y && !y16) return;
  bn_rows::run(
      {bn_rows::pass::normalize, l, x, nullptr, nullptr, nullptr, relu, mean, scale, shift, nullptr, y, nullptr, y16});
}

LOOM_DECL void batch_norm_rows_gradient_sums(const float* x, const float* dy, const batch_norm_rows_layout& l,
                                             const float* mean, const float* relu_scale, const float* relu_shift,
                                             double* partials, double* sums) {
  if (l.rows() == 0) {
    std::fill_n(sums, 2 * l.channels, 0.0);
    return;
  }
  bn_rows::run({bn_rows::pass::gradient_sums, l, x, dy, relu_scale, relu_shift, false, mean, nullptr, nullptr, nullptr,
                nullptr, partials, nullptr});
  bn_rows::add_shares(partials, l, sums);
}

LOOM_DECL void batch_norm_rows_input_gradient(const float* x, const float* dy, const batch_norm_rows_layout& l,
                                              const float* mean, const float* relu_scale, const float* relu_shift,
                                              const float* a, const float* b, const float* d, float* dx,
                                              std::uint16_t* dx16) {
  if (!dx && !dx16) return;
  bn_rows::run({bn_rows::pass::input_gradient, l, x, dy, relu_scale, relu_shift, false, mean, a, b, d, dx, nullptr,
                dx16});
}

}  // namespace loom::detail
