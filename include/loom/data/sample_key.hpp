// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a decoding pipeline and a sample reader share without either's libraries: the key that
// names a sample's randomness, and the error an image that cannot be decoded raises.

#include <cstdint>

#include "loom/core/error.hpp"

namespace loom::data {

/// Names one sample of one epoch of one run: its augmentation draws are a function of these
/// three numbers alone, whatever thread decodes it and whenever. `index` is the sample's
/// position in the whole data set (the same on every rank and world size).
struct sample_key {
  std::uint64_t seed = 0, epoch = 0, index = 0;
};

/// An encoded image that cannot be turned into a sample: corrupt or truncated data, zero size,
/// an unsupported format or colour space, too many pixels, or a size the pipeline cannot crop.
/// what() names what was expected and what was found; the caller adds where the bytes came from.
struct bad_image : io_error {
  using io_error::io_error;
};

}  // namespace loom::data
