// SPDX-License-Identifier: Apache-2.0
// Normalizing before the crop: the steps go in one order.
// expect: loom::image_pipeline: steps out of order or repeated
// expect: image_step_out_of_order_at_step<2, loom::data::random_resized_crop<224
// max-errors: 2
#include "loom/data/image_pipeline.hpp"

using train = loom::data::image_pipeline<loom::data::rgb, loom::data::imagenet_normalize, loom::data::random_resized_crop<224>>;

int main() { return static_cast<int>(train::output_shape::size); }
