// SPDX-License-Identifier: Apache-2.0
// An installed loom::images: a pipeline's shape at compile time, and the image libraries linked
// and called (an empty file is a bad_image that libjpeg's and libspng's readers report).
#include <loom/data/image_pipeline.hpp>

#include <cstdio>

int main() {
  namespace ld = loom::data;
  using train = ld::image_pipeline<ld::rgb, ld::random_resized_crop<224>, ld::flip, ld::imagenet_normalize>;
  static_assert(train::output_shape::size == 3 * 224 * 224);
  static const unsigned char not_a_jpeg[] = {0xFF, 0xD8, 0xFF, 0xE0, 0, 16};
  float out[train::output_shape::size];
  try {
    train{}(std::as_bytes(std::span(not_a_jpeg)), {}, out);
  } catch (const ld::bad_image& e) {
    std::printf("loom images consumer: %s\n", e.what());
    return 0;
  }
  return 1;
}
