// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom's own float batch normalisation over activations whose channels are the innermost
// dimension of each pixel: channels-last (nhwc: each pixel's C values in a row) and oneDNN's
// blocked nChw16c / nChw8c (each pixel's 16 or 8 values of one block of channels in a row).
// Four passes, each one walk over the activation: the per-channel sums of x and x^2 (forward),
// the normalisation (with the ReLU after it when fused), the per-channel sums of dy and
// dy (x - mean) (backward; with a fused ReLU, dy where forward's normalised value was positive,
// recomputed from x: neither a mask nor forward's output is read), and the input gradient. The
// sums come out as double totals between the passes, where a synchronized batch norm adds them
// up over its replicas: one forward, one backward, whatever the group (oneDNN's primitives take
// the statistics as given or as their own, never both, so synchronized they ran forward twice
// and corrected the input gradient in a third pass).
//
// Why loom's own: oneDNN 2.6's batch normalization on nhwc ran 1.8-2.5x slower than on its
// blocked layouts for 32 and 64 channels (one thread), and a bf16 convolution (AMX) writes nhwc.
// The passes are compiled for AVX-512, AVX2 + FMA and plain x86-64 and dispatched on the ISA
// oneDNN runs (so ONEDNN_MAX_CPU_ISA=AVX2 runs the AVX2 ones).
//
// Determinism: the rows are cut into batch_norm_row_units fixed shares whatever the thread count;
// each share sums in float over runs of at most 64 rows (values less the channel's first value,
// so that a large mean does not swamp the variance) into double, and the shares add up in order.
// The same input gives the same bits on 1 thread or 64.

#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"

namespace loom::detail {

/// An activation of `batch` samples of `channels` channels of `spatial` pixels whose channels
/// come in blocks of `block` (8, 16, or channels for channels-last): `runs()` runs of `spatial`
/// rows of `block` floats, run r holding channels [(r % groups()) * block, + block).
struct batch_norm_rows_layout {
  std::size_t batch, channels, spatial, block;
  std::size_t groups() const { return channels / block; }
  std::size_t runs() const { return batch * groups(); }
  std::size_t rows() const { return runs() * spatial; }
};

/// The most shares the rows are cut into for the sums (see above; fewer for small activations).
inline constexpr std::size_t batch_norm_row_units = 32;
/// The doubles the sum passes need as scratch: each share's two sums per channel.
constexpr std::size_t batch_norm_rows_partials(std::size_t channels) { return batch_norm_row_units * 2 * channels; }

/// sums[c] = sum of channel c's values, sums[C + c] = of their squares, sums[2C] = the count of
/// values per channel (batch * spatial): what kernels::batch_norm_sums writes, for
/// kernels::batch_norm_moments. `partials` holds batch_norm_rows_partials(C) doubles.
LOOM_DECL void batch_norm_rows_sums(const float* x, const batch_norm_rows_layout& l, double* partials, double* sums);

/// y = (x - mean[c]) * scale[c] + shift[c], then max(y, 0) when relu (the ReLU after it, fused);
/// when y16 is not null, also y16 = y rounded to bf16 (detail::bf16_bits: the copy a bf16
/// convolution after it reads, activation::bf16). y null with y16 not: the copy alone (where
/// nothing reads y's float values). Both null: nothing is written.
LOOM_DECL void batch_norm_rows_normalize(const float* x, const batch_norm_rows_layout& l, const float* mean,
                                         const float* scale, const float* shift, float* y, bool relu,
                                         std::uint16_t* y16 = nullptr);

/// With g = dy, or (relu_scale and relu_shift not null: the scale and shift of a forward with a
/// fused ReLU) dy where that forward's (x - mean[c]) * scale[c] + shift[c] was positive — the
/// ReLU's gradient, recomputed from x as batch_norm_rows_normalize computed it (the same bits),
/// so that forward's output is not read — and 0 elsewhere: sums[c] = the sum of g over channel
/// c, sums[C + c] = of g (x - mean[c]).
LOOM_DECL void batch_norm_rows_gradient_sums(const float* x, const float* dy, const batch_norm_rows_layout& l,
                                             const float* mean, const float* relu_scale, const float* relu_shift,
                                             double* partials, double* sums);

/// dx = a[c] g + b[c] (x - mean[c]) + d[c], g as above; dx16 (when not null) = dx rounded to
/// bf16, as y16 above, and as there dx null with dx16 not writes the copy alone.
LOOM_DECL void batch_norm_rows_input_gradient(const float* x, const float* dy, const batch_norm_rows_layout& l,
                                              const float* mean, const float* relu_scale, const float* relu_shift,
                                              const float* a, const float* b, const float* d, float* dx,
                                              std::uint16_t* dx16 = nullptr);

}  // namespace loom::detail

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/backend/cpu/impl/batch_norm_rows.ipp"
#endif
