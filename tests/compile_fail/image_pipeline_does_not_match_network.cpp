// SPDX-License-Identifier: Apache-2.0
// A data set of 3 x 224 x 224 images (an image pipeline's output) for a network of 1 x 28 x 28
// inputs: the trainer's check names both shapes.
// expect: the data set's samples do not have the network's input size
// expect: network_input_does_not_match_samples<loom::shape<1, 28, 28>, loom::shape<3, 224, 224>
// max-errors: 2
#include "loom/data/image_pipeline.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/nn/network.hpp"
#include "loom/train/trainer.hpp"

using pipeline = loom::data::image_pipeline<loom::data::rgb, loom::data::random_resized_crop<224>, loom::data::flip>;
struct images {  // what a data set of such images says about its samples
  using sample_shape = pipeline::output_shape;
  static constexpr std::size_t classes = 10;
};
using net = loom::network<loom::input<1, 28, 28>, loom::flatten, loom::linear<10>>;

int main() {
  loom::detail::check_dataset_for<net, images>();
  return 0;
}
