// SPDX-License-Identifier: Apache-2.0
#pragma once
// The kernel body that rounds a float matrix to bf16 for math_mode::bf16: loom::cuda runs it
// before a bf16 tensor-core product, so that the operands are rounded exactly as loom::cpu's
// oneDNN reorders round them (to nearest, ties to even). Not the product itself.

#include <cstddef>
#include <cstdint>

#include "loom/core/config.hpp"
#include "loom/core/math_mode.hpp"

namespace loom::kernels {

/// dst[r * cols + c] = bf16(src[r * ld + c]) for a (rows, cols) row-major src with row stride
/// ld >= cols: a compact bf16 copy (its row stride is cols). One element per call, i over
/// [0, rows * cols).
struct round_to_bf16_rows {
  const float* src;
  std::uint16_t* dst;
  std::size_t cols, ld;
  LOOM_HD void operator()(std::size_t i) const {
    const std::size_t r = i / cols, c = i % cols;
    dst[i] = detail::bf16_bits(src[r * ld + c]);
  }
};

}  // namespace loom::kernels
