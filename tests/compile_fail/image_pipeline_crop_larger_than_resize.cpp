// SPDX-License-Identifier: Apache-2.0
// A 256 x 256 centre crop of images resized to a shorter side of 224.
// expect: the crop is larger than the images resize<S> makes
// expect: crop_larger_than_resize_shorter_side_at_step<2, 256, 256, 224>
// max-errors: 2
#include "loom/data/image_pipeline.hpp"

using eval = loom::data::image_pipeline<loom::data::rgb, loom::data::resize<224>, loom::data::center_crop<256>>;

int main() { return static_cast<int>(eval::output_shape::size); }
