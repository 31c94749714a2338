// SPDX-License-Identifier: Apache-2.0
#pragma once
// Image pipelines as types: decode a JPEG or PNG, crop, resize, flip and normalize it into the
// network's (C, H, W) float input in one pass over the pixels, with the output shape known at
// compile time and each sample's random draws a function of its sample_key alone. Steps that
// do not compose (a crop larger than the images before it, steps out of order) fail to compile
// with a sentence. Not the decoding itself (image.hpp) nor the threads (decode_pool.hpp).
//
//   using train = loom::data::image_pipeline<loom::data::rgb, loom::data::random_resized_crop<224>,
//                                            loom::data::flip, loom::data::imagenet_normalize>;
//   using eval = loom::data::image_pipeline<loom::data::rgb, loom::data::resize<256>,
//                                           loom::data::center_crop<224>, loom::data::imagenet_normalize>;
//   using cifar = loom::data::image_pipeline<loom::data::rgb, loom::data::expect_size<32>,
//                                            loom::data::random_crop<32, 32, 4>, loom::data::flip,
//                                            loom::data::normalize<{0.4914, 0.4822, 0.4465}, {0.247, 0.243, 0.261}>>;
//   using fashion = loom::data::decode_to<1, 28, 28>;   // grey, exactly 28 x 28, pixel / 255
//
// Semantics are torchvision's (RandomResizedCrop, Resize, CenterCrop, RandomCrop with padding,
// RandomHorizontalFlip, ToDtype(scale=True), Normalize); resampling is its bilinear with
// antialias (PIL's triangle filter, widened when shrinking). docs/data-images.md says more.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "loom/core/error.hpp"
#include "loom/core/random.hpp"
#include "loom/core/shape.hpp"
#include "loom/data/decode_pool.hpp"  // detail::decode_scratch_bytes
#include "loom/data/image.hpp"

namespace loom::data {

/// A range [low, high] of a random_resized_crop draw (area fraction, aspect ratio).
struct value_range {
  double low, high;
};

/// One value per channel (mean or standard deviation): one value for every channel, or three.
struct channel_values {
  double v[3];
  std::size_t n;
  constexpr channel_values(double all) : v{all, all, all}, n(1) {}
  constexpr channel_values(double r, double g, double b) : v{r, g, b}, n(3) {}
};

namespace detail {

enum class image_step_kind { channels, expect_size, resize, random_resized_crop, center_crop, random_crop, flip, normalize };

/// What a step is, as data the composition check and the run-time plan read.
struct image_step_info {
  image_step_kind kind;
  int phase;                  // the position steps of this kind take: 0 channels .. 5 normalize
  std::size_t a = 0, b = 0;   // channels: (C, -); sizes: (height, width); resize<S>: (S, 0)
  std::size_t padding = 0;    // random_crop
  double p = 0;               // horizontal_flip
  value_range scale{0, 0}, ratio{0, 0};
  channel_values mean{0.0}, std{1.0};
};

}  // namespace detail

/// Step: decode to C channels, 1 (grey; colour files by their luma) or 3 (RGB; grey files
/// repeated). Every pipeline starts with it.
template <std::size_t C>
struct channels {
  static_assert(C == 1 || C == 3, "loom::data::channels<C>: images decode to 1 (grey) or 3 (RGB) channels");
  static constexpr detail::image_step_info info{detail::image_step_kind::channels, 0, C};
  static std::string name() { return C == 1 ? "gray" : "rgb"; }
};
using gray = channels<1>;
using rgb = channels<3>;

/// Step: every image must be exactly H x W pixels (any other size is a bad_image). With
/// nothing after it that changes the size, the output is H x W.
template <std::size_t H, std::size_t W = H>
struct expect_size {
  static_assert(H > 0 && W > 0, "loom::data::expect_size<H, W>: sizes must be positive");
  static constexpr detail::image_step_info info{detail::image_step_kind::expect_size, 1, H, W};
  static std::string name() { return "expect_size<" + std::to_string(H) + ", " + std::to_string(W) + ">"; }
};

/// Step: resize<S> scales the image so that its shorter side is S pixels (torchvision's
/// Resize(S): the longer side becomes int(S * longer / shorter)); resize<H, W> to exactly
/// H x W. Bilinear with antialias.
template <std::size_t Size, std::size_t Width = 0>
struct resize {
  static_assert(Size > 0, "loom::data::resize: the size must be positive");
  static constexpr detail::image_step_info info{detail::image_step_kind::resize, 2, Size, Width};
  static std::string name() {
    return Width ? "resize<" + std::to_string(Size) + ", " + std::to_string(Width) + ">" : "resize<" + std::to_string(Size) + ">";
  }
};

/// Step: torchvision's RandomResizedCrop(size=(H, W), scale=Scale, ratio=Ratio): a window of
/// area fraction in Scale and aspect ratio (width / height, drawn log-uniformly) in Ratio, at
/// a random place, up to 10 tries, else the centred window of the largest allowed ratio;
/// resized to H x W, bilinear with antialias.
template <std::size_t H, std::size_t W = H, value_range Scale = value_range{0.08, 1.0},
          value_range Ratio = value_range{3.0 / 4.0, 4.0 / 3.0}>
struct random_resized_crop {
  static_assert(H > 0 && W > 0, "loom::data::random_resized_crop<H, W>: sizes must be positive");
  static_assert(Scale.low > 0 && Scale.low <= Scale.high,
                "loom::data::random_resized_crop: the scale range needs 0 < low <= high");
  static_assert(Ratio.low > 0 && Ratio.low <= Ratio.high,
                "loom::data::random_resized_crop: the ratio range needs 0 < low <= high");
  static constexpr detail::image_step_info info{detail::image_step_kind::random_resized_crop, 2, H, W, 0, 0, Scale, Ratio};
  static std::string name() { return "random_resized_crop<" + std::to_string(H) + ", " + std::to_string(W) + ">"; }
};

/// Step: the centred H x W window (torchvision's CenterCrop: the offset rounds half to even).
/// An image smaller than H x W is a bad_image.
template <std::size_t H, std::size_t W = H>
struct center_crop {
  static_assert(H > 0 && W > 0, "loom::data::center_crop<H, W>: sizes must be positive");
  static constexpr detail::image_step_info info{detail::image_step_kind::center_crop, 3, H, W};
  static std::string name() { return "center_crop<" + std::to_string(H) + ", " + std::to_string(W) + ">"; }
};

/// Step: torchvision's RandomCrop((H, W), padding=Padding): Padding zero pixels on every side,
/// then an H x W window at a random place. An image that cannot hold the window even padded
/// (smaller than H - 2 Padding or W - 2 Padding) is a bad_image.
template <std::size_t H, std::size_t W = H, std::size_t Padding = 0>
struct random_crop {
  static_assert(H > 0 && W > 0, "loom::data::random_crop<H, W, Padding>: sizes must be positive");
  static constexpr detail::image_step_info info{detail::image_step_kind::random_crop, 3, H, W, Padding};
  static std::string name() {
    return "random_crop<" + std::to_string(H) + ", " + std::to_string(W) + ", " + std::to_string(Padding) + ">";
  }
};

/// Step: mirror left to right with probability P.
template <double P = 0.5>
struct horizontal_flip {
  static_assert(P >= 0 && P <= 1, "loom::data::horizontal_flip<P>: the probability P must be in [0, 1]");
  static constexpr detail::image_step_info info{detail::image_step_kind::flip, 4, 0, 0, 0, P};
  static std::string name() { return "horizontal_flip<" + std::to_string(P) + ">"; }
};
using flip = horizontal_flip<>;

/// Step: (pixel / 255 - Mean[c]) / Std[c] per channel c (torchvision's ToDtype(float32,
/// scale=True) then Normalize), computed as pixel * a[c] + b[c] with a = 1 / (255 Std),
/// b = -Mean / Std. Without it a pipeline writes pixel / 255.
template <channel_values Mean, channel_values Std>
struct normalize {
  static_assert(Std.v[0] > 0 && Std.v[1] > 0 && Std.v[2] > 0,
                "loom::data::normalize<Mean, Std>: every standard deviation must be positive");
  static constexpr detail::image_step_info info{detail::image_step_kind::normalize, 5, 0, 0, 0, 0, {0, 0}, {0, 0}, Mean, Std};
  static std::string name() { return "normalize"; }
};
/// ImageNet's mean and standard deviation (torchvision's models).
using imagenet_normalize = normalize<channel_values{0.485, 0.456, 0.406}, channel_values{0.229, 0.224, 0.225}>;

/// Any image step.
template <class T>
concept image_step = requires {
  { T::info } -> std::convertible_to<detail::image_step_info>;
};

}  // namespace loom::data

namespace loom::diagnostic {
template <std::size_t StepIndex, class Type>
struct not_an_image_step_at_step;
template <class FirstStep>
struct image_pipeline_does_not_start_with_channels;
template <std::size_t StepIndex, class Step, class StepBefore>
struct image_step_out_of_order_at_step;
template <std::size_t StepIndex, std::size_t CropHeight, std::size_t CropWidth, std::size_t ShorterSide>
struct crop_larger_than_resize_shorter_side_at_step;
template <std::size_t StepIndex, std::size_t CropHeight, std::size_t CropWidth, std::size_t Padding, std::size_t InputHeight,
          std::size_t InputWidth>
struct crop_larger_than_its_input_at_step;
template <std::size_t MeanValues, std::size_t StdValues, std::size_t Channels>
struct normalize_values_do_not_match_channels;
}  // namespace loom::diagnostic

namespace loom::data {
namespace detail {

enum class image_pipeline_error { none, empty, not_a_step, no_channels, out_of_order, crop_too_large_for_resize,
                                  crop_too_large, size_not_fixed, normalize_count };

/// What the steps make together: the output's size, the run-time configuration, or the
/// first error (with the step index and the numbers its message shows).
struct image_composition {
  image_pipeline_error error = image_pipeline_error::none;
  std::size_t at = 0, before = 0;     // the failing step and, out of order, the step before it
  std::size_t n1 = 0, n2 = 0, n3 = 0, n4 = 0, n5 = 0;
  // The configuration (valid when error == none):
  std::size_t channels = 1, height = 1, width = 1;
  bool expect = false;
  std::size_t expect_h = 0, expect_w = 0;
  image_step_kind resample = image_step_kind::channels;  // channels: none; resize; random_resized_crop
  std::size_t resample_h = 0, resample_w = 0;             // resize<S>: (S, 0)
  value_range scale{0, 0}, ratio{0, 0};
  std::size_t resample_step = 0;
  image_step_kind crop = image_step_kind::channels;  // channels: none; center_crop; random_crop
  std::size_t crop_h = 0, crop_w = 0, padding = 0, crop_step = 0;
  double flip_p = 0;
  std::size_t flip_step = 0;
  bool normalize = false;
  channel_values mean{0.0}, std{1.0};
};

template <class... Steps>
consteval image_composition compose_image_steps() {
  image_composition r;
  constexpr std::size_t n = sizeof...(Steps);
  if constexpr (n == 0) {
    r.error = image_pipeline_error::empty;
    return r;
  } else {
    constexpr bool is_step[] = {image_step<Steps>...};
    for (std::size_t i = 0; i < n; ++i)
      if (!is_step[i]) {
        r.error = image_pipeline_error::not_a_step;
        r.at = i;
        return r;
      }
    if constexpr ((image_step<Steps> && ...)) {
      constexpr image_step_info s[] = {Steps::info...};
      if (s[0].kind != image_step_kind::channels) {
        r.error = image_pipeline_error::no_channels;
        return r;
      }
      for (std::size_t i = 1; i < n; ++i)
        if (s[i].phase <= s[i - 1].phase) {
          r.error = image_pipeline_error::out_of_order;
          r.at = i;
          r.before = i - 1;
          return r;
        }
      // The size as it goes: known (h, w), only the shorter side (resize<S> of an unknown
      // size), or unknown.
      enum { unknown, shorter, known } state = unknown;
      std::size_t h = 0, w = 0, side = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const image_step_info& t = s[i];
        switch (t.kind) {
          case image_step_kind::channels: r.channels = t.a; break;
          case image_step_kind::expect_size:
            r.expect = true;
            r.expect_h = h = t.a;
            r.expect_w = w = t.b;
            state = known;
            break;
          case image_step_kind::resize:
            r.resample = t.kind;
            r.resample_h = t.a;
            r.resample_w = t.b;
            r.resample_step = i;
            if (t.b) {
              h = t.a, w = t.b, state = known;
            } else if (state == known) {
              // torchvision's Resize(S): the shorter side S, the longer int(S * longer / shorter).
              const bool wide = w > h;
              const std::size_t sh = wide ? h : w, lg = wide ? w : h;
              const auto nl = static_cast<std::size_t>(static_cast<double>(t.a * lg) / static_cast<double>(sh));
              h = wide ? t.a : nl;
              w = wide ? nl : t.a;
            } else {
              side = t.a, state = shorter;
            }
            break;
          case image_step_kind::random_resized_crop:
            r.resample = t.kind;
            r.resample_h = h = t.a;
            r.resample_w = w = t.b;
            r.scale = t.scale;
            r.ratio = t.ratio;
            r.resample_step = i;
            state = known;
            break;
          case image_step_kind::center_crop:
          case image_step_kind::random_crop: {
            const std::size_t pad = t.kind == image_step_kind::random_crop ? t.padding : 0;
            if (state == shorter && (t.a > side + 2 * pad || t.b > side + 2 * pad)) {
              r.error = image_pipeline_error::crop_too_large_for_resize;
              r.at = i, r.n1 = t.a, r.n2 = t.b, r.n3 = side, r.n4 = pad;
              return r;
            }
            if (state == known && (t.a > h + 2 * pad || t.b > w + 2 * pad)) {
              r.error = image_pipeline_error::crop_too_large;
              r.at = i, r.n1 = t.a, r.n2 = t.b, r.n3 = pad, r.n4 = h, r.n5 = w;
              return r;
            }
            r.crop = t.kind;
            r.crop_h = h = t.a;
            r.crop_w = w = t.b;
            r.padding = pad;
            r.crop_step = i;
            state = known;
            break;
          }
          case image_step_kind::flip:
            r.flip_p = t.p;
            r.flip_step = i;
            break;
          case image_step_kind::normalize:
            if ((t.mean.n != 1 && t.mean.n != r.channels) || (t.std.n != 1 && t.std.n != r.channels)) {
              r.error = image_pipeline_error::normalize_count;
              r.at = i, r.n1 = t.mean.n, r.n2 = t.std.n, r.n3 = r.channels;
              return r;
            }
            r.normalize = true;
            r.mean = t.mean;
            r.std = t.std;
            break;
        }
      }
      if (state != known) {
        r.error = image_pipeline_error::size_not_fixed;
        return r;
      }
      r.height = h;
      r.width = w;
    }
    return r;
  }
}

template <std::size_t I, class... T>
using nth_type = std::tuple_element_t<I, std::tuple<T...>>;

/// Calling this fails with the marker's name (and values) in the message: loom::detail::fail_with
/// of layers/layer.hpp, which data/ does not include (tests/headers/layering.cmake).
template <class Marker>
consteval bool fail_with() {
  using marker_is_never_defined [[maybe_unused]] = typename Marker::loom_diagnostic;
  return false;
}

/// The compile-time report: one sentence per kind of mistake (only the first mistake is
/// reported), and a loom::diagnostic:: marker with the numbers.
template <class... Steps>
consteval bool check_image_pipeline() {
  constexpr image_composition c = compose_image_steps<Steps...>();
  using E = image_pipeline_error;
  static_assert(c.error != E::empty, "loom::image_pipeline needs steps: at least loom::data::gray or loom::data::rgb and a size");
  static_assert(c.error != E::not_a_step,
                "loom::image_pipeline: a step is not an image step (expected channels, expect_size, resize, "
                "random_resized_crop, center_crop, random_crop, horizontal_flip or normalize); the step's index and "
                "type are in the loom::diagnostic:: name the compiler prints");
  if constexpr (c.error == E::not_a_step) fail_with<diagnostic::not_an_image_step_at_step<c.at, nth_type<c.at, Steps...>>>();
  static_assert(c.error != E::no_channels,
                "loom::image_pipeline: the first step says the channels: loom::data::gray (channels<1>) or "
                "loom::data::rgb (channels<3>)");
  if constexpr (c.error == E::no_channels) fail_with<diagnostic::image_pipeline_does_not_start_with_channels<nth_type<0, Steps...>>>();
  static_assert(c.error != E::out_of_order,
                "loom::image_pipeline: steps out of order or repeated: the order is channels, expect_size, one resize or "
                "random_resized_crop, one center_crop or random_crop, horizontal_flip, normalize (each optional after "
                "channels; the two steps are in the loom::diagnostic:: name the compiler prints)");
  if constexpr (c.error == E::out_of_order)
    fail_with<diagnostic::image_step_out_of_order_at_step<c.at, nth_type<c.at, Steps...>, nth_type<c.before, Steps...>>>();
  static_assert(c.error != E::crop_too_large_for_resize,
                "loom::image_pipeline: the crop is larger than the images resize<S> makes (their shorter side is S): "
                "crop at most S x S (plus twice random_crop's padding), or resize to a larger S (the crop's size and S "
                "are in the loom::diagnostic:: name the compiler prints)");
  if constexpr (c.error == E::crop_too_large_for_resize)
    fail_with<diagnostic::crop_larger_than_resize_shorter_side_at_step<c.at, c.n1, c.n2, c.n3>>();
  static_assert(c.error != E::crop_too_large,
                "loom::image_pipeline: the crop is larger than the images the steps before it make (padding included): "
                "the sizes are in the loom::diagnostic:: name the compiler prints");
  if constexpr (c.error == E::crop_too_large)
    fail_with<diagnostic::crop_larger_than_its_input_at_step<c.at, c.n1, c.n2, c.n3, c.n4, c.n5>>();
  static_assert(c.error != E::size_not_fixed,
                "loom::image_pipeline: the output size depends on the image: give it with expect_size<H, W>, "
                "resize<H, W>, random_resized_crop, center_crop or random_crop");
  static_assert(c.error != E::normalize_count,
                "loom::image_pipeline: normalize's mean and std need 1 value or one per channel (the counts are in the "
                "loom::diagnostic:: name the compiler prints)");
  if constexpr (c.error == E::normalize_count)
    fail_with<diagnostic::normalize_values_do_not_match_channels<c.n1, c.n2, c.n3>>();
  return c.error == E::none;
}

/// The random stream of image augmentation ("imag"), apart from shuffling, initialisation and dropout.
inline constexpr std::uint64_t augment_stream = 0x696d6167ULL;

/// Draw `draw` of step `step` of the sample `key`: 64 random bits, a function of those alone.
inline std::uint64_t augment_bits(const sample_key& key, std::size_t step, std::uint64_t draw) noexcept {
  return counter_hash(counter_hash(key.seed, augment_stream, key.epoch), key.index, (static_cast<std::uint64_t>(step) << 16) | draw);
}

/// Uniform in [0, 1) for draw `draw` of step `step` of `key`.
inline double augment_uniform(const sample_key& key, std::size_t step, std::uint64_t draw) noexcept {
  return uniform01(augment_bits(key, step, draw));
}

}  // namespace detail

/// Where a sample's pixels come from: the window of the image that is resampled, the size it
/// is resampled to, and where the output lies in that (its top-left may be negative, or the
/// output may reach past it: padding). Without a resampling step, the window is the whole image
/// and the size is the image's.
struct image_geometry {
  std::size_t src_x = 0, src_y = 0, src_w = 0, src_h = 0;
  std::size_t res_w = 0, res_h = 0;
  bool resample = false;
  std::ptrdiff_t out_x = 0, out_y = 0;
  std::size_t out_w = 0, out_h = 0;
  bool flip = false;
};

/// How a sample is decoded and resampled: its geometry, the DCT reduction (JPEG: the image is
/// decoded at 1/reduction of its size when the window is at least that many times larger than
/// what it is resampled to), and the window in the reduced image's coordinates.
struct image_plan {
  image_geometry geometry;
  unsigned reduction = 1;
  std::size_t image_w = 0, image_h = 0;  // the (reduced) decoded image's size
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // the window, in the reduced image's coordinates
};

namespace detail {

inline std::string image_what(const image_header& h) {
  return std::string("loom: ") + to_string(h.format) + " image of " + size_text(h.width, h.height) + " pixels";
}

/// The geometry of one sample of an image of w x h pixels (c: the pipeline's composition).
/// Throws bad_image when the image does not fit the steps.
inline image_geometry plan_geometry(const image_composition& c, const image_header& hd, const sample_key& key) {
  const std::size_t w = hd.width, h = hd.height;
  image_geometry g;
  if (c.expect && (w != c.expect_w || h != c.expect_h))
    throw bad_image(image_what(hd) + ": expected exactly " + size_text(c.expect_w, c.expect_h) +
                    " pixels (expect_size<" + std::to_string(c.expect_h) + ", " + std::to_string(c.expect_w) + ">)");
  g.src_x = 0, g.src_y = 0, g.src_w = w, g.src_h = h;
  g.res_w = w, g.res_h = h;
  if (c.resample == image_step_kind::resize) {
    g.resample = true;
    if (c.resample_w) {
      g.res_h = c.resample_h, g.res_w = c.resample_w;
    } else {
      const bool wide = w > h;
      const std::size_t sh = wide ? h : w, lg = wide ? w : h, s = c.resample_h;
      const auto nl = static_cast<std::size_t>(static_cast<double>(s * lg) / static_cast<double>(sh));
      g.res_h = wide ? s : nl;
      g.res_w = wide ? nl : s;
    }
  } else if (c.resample == image_step_kind::random_resized_crop) {
    // torchvision's RandomResizedCrop.get_params, draws 4t..4t+3 of try t.
    g.resample = true;
    g.res_h = c.resample_h, g.res_w = c.resample_w;
    const double area = static_cast<double>(w) * static_cast<double>(h);
    const double lr0 = std::log(c.ratio.low), lr1 = std::log(c.ratio.high);
    const std::size_t step = c.resample_step;
    bool found = false;
    for (std::uint64_t t = 0; t < 10 && !found; ++t) {
      const double target = area * (c.scale.low + (c.scale.high - c.scale.low) * augment_uniform(key, step, 4 * t));
      const double aspect = std::exp(lr0 + (lr1 - lr0) * augment_uniform(key, step, 4 * t + 1));
      const double cw = std::nearbyint(std::sqrt(target * aspect));  // Python's round: half to even
      const double ch = std::nearbyint(std::sqrt(target / aspect));
      if (cw > 0 && cw <= static_cast<double>(w) && ch > 0 && ch <= static_cast<double>(h)) {
        g.src_w = static_cast<std::size_t>(cw);
        g.src_h = static_cast<std::size_t>(ch);
        g.src_y = static_cast<std::size_t>(augment_uniform(key, step, 4 * t + 2) * static_cast<double>(h - g.src_h + 1));
        g.src_x = static_cast<std::size_t>(augment_uniform(key, step, 4 * t + 3) * static_cast<double>(w - g.src_w + 1));
        found = true;
      }
    }
    if (!found) {
      const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
      if (in_ratio < c.ratio.low) {
        g.src_w = w;
        g.src_h = static_cast<std::size_t>(std::nearbyint(static_cast<double>(w) / c.ratio.low));
      } else if (in_ratio > c.ratio.high) {
        g.src_h = h;
        g.src_w = static_cast<std::size_t>(std::nearbyint(static_cast<double>(h) * c.ratio.high));
      } else {
        g.src_w = w, g.src_h = h;
      }
      g.src_w = std::clamp<std::size_t>(g.src_w, 1, w);
      g.src_h = std::clamp<std::size_t>(g.src_h, 1, h);
      g.src_y = (h - g.src_h) / 2;
      g.src_x = (w - g.src_w) / 2;
    }
  }
  g.out_w = g.res_w, g.out_h = g.res_h;
  if (c.crop == image_step_kind::center_crop) {
    if (g.res_w < c.crop_w || g.res_h < c.crop_h)
      throw bad_image(image_what(hd) + ": center_crop<" + std::to_string(c.crop_h) + ", " + std::to_string(c.crop_w) +
                      "> needs at least " + size_text(c.crop_w, c.crop_h) + " pixels" +
                      (g.resample ? " after resampling, found " : ", found ") + size_text(g.res_w, g.res_h));
    // torchvision: int(round((size - crop) / 2)), Python's round (half to even).
    g.out_x = static_cast<std::ptrdiff_t>(std::nearbyint(static_cast<double>(g.res_w - c.crop_w) / 2.0));
    g.out_y = static_cast<std::ptrdiff_t>(std::nearbyint(static_cast<double>(g.res_h - c.crop_h) / 2.0));
    g.out_w = c.crop_w, g.out_h = c.crop_h;
  } else if (c.crop == image_step_kind::random_crop) {
    const std::size_t pw = g.res_w + 2 * c.padding, ph = g.res_h + 2 * c.padding;
    if (pw < c.crop_w || ph < c.crop_h)
      throw bad_image(image_what(hd) + ": random_crop<" + std::to_string(c.crop_h) + ", " + std::to_string(c.crop_w) + ", " +
                      std::to_string(c.padding) + "> needs at least " +
                      size_text(c.crop_w > 2 * c.padding ? c.crop_w - 2 * c.padding : 1,
                                c.crop_h > 2 * c.padding ? c.crop_h - 2 * c.padding : 1) +
                      " pixels" + (g.resample ? " after resampling" : "") + " (with " + std::to_string(c.padding) +
                      " pixels of padding on each side), found " + size_text(g.res_w, g.res_h));
    const auto i = static_cast<std::size_t>(augment_uniform(key, c.crop_step, 0) * static_cast<double>(ph - c.crop_h + 1));
    const auto j = static_cast<std::size_t>(augment_uniform(key, c.crop_step, 1) * static_cast<double>(pw - c.crop_w + 1));
    g.out_y = static_cast<std::ptrdiff_t>(i) - static_cast<std::ptrdiff_t>(c.padding);
    g.out_x = static_cast<std::ptrdiff_t>(j) - static_cast<std::ptrdiff_t>(c.padding);
    g.out_w = c.crop_w, g.out_h = c.crop_h;
  }
  g.flip = c.flip_p > 0 && augment_uniform(key, c.flip_step, 0) < c.flip_p;
  return g;
}

/// The plan of one sample: its geometry, and for a JPEG that is resampled the largest DCT
/// reduction (2, 4, 8) that keeps the window at least as large as what it is resampled to.
inline image_plan plan_image(const image_composition& c, const image_header& hd, const sample_key& key) {
  image_plan p;
  p.geometry = plan_geometry(c, hd, key);
  const image_geometry& g = p.geometry;
  if (g.resample && hd.format == image_format::jpeg)
    for (unsigned d = 8; d > 1; d /= 2)
      if (g.src_w >= g.res_w * d && g.src_h >= g.res_h * d) {
        p.reduction = d;
        break;
      }
  const std::size_t d = p.reduction;
  p.image_w = (hd.width + d - 1) / d;
  p.image_h = (hd.height + d - 1) / d;
  if (d == 1) {
    p.x0 = static_cast<double>(g.src_x), p.x1 = static_cast<double>(g.src_x + g.src_w);
    p.y0 = static_cast<double>(g.src_y), p.y1 = static_cast<double>(g.src_y + g.src_h);
  } else {
    const double fx = static_cast<double>(p.image_w) / static_cast<double>(hd.width);
    const double fy = static_cast<double>(p.image_h) / static_cast<double>(hd.height);
    p.x0 = static_cast<double>(g.src_x) * fx, p.x1 = static_cast<double>(g.src_x + g.src_w) * fx;
    p.y0 = static_cast<double>(g.src_y) * fy, p.y1 = static_cast<double>(g.src_y + g.src_h) * fy;
  }
  return p;
}

/// The taps of one axis: output i reads `count[i]` pixels from `first[i]` on (relative to the
/// axis's origin), with weights w[i * taps + k]; count 0 is padding.
struct axis_taps {
  std::int32_t* first;
  std::int32_t* count;
  float* w;
  std::size_t taps;  // the most taps of any output
};

/// The most taps one output of an axis resampled from `extent` pixels to `size` can have.
inline std::size_t max_taps(double extent, std::size_t size, bool resample) {
  if (!resample) return 1;
  const double scale = extent / static_cast<double>(size);
  const double support = scale >= 1.0 ? scale : 1.0;
  return static_cast<std::size_t>(std::ceil(support)) * 2 + 1;
}

/// Fills the taps of one axis: `n` outputs at resampled positions offset + i (mirrored:
/// offset + n - 1 - i), the window [in0, in1) of the axis (relative to its origin, whose pixels
/// are [0, in_size)) resampled to `size` positions. Bilinear with antialias (PIL's and
/// torchvision's coefficients: a triangle filter widened by the scale when shrinking, taps
/// clamped to the window's pixels, weights normalised to sum 1). Without resampling, each
/// position reads one pixel with weight 1. Positions outside [0, size) are padding.
inline void fill_taps(axis_taps& a, std::size_t n, std::ptrdiff_t offset, bool mirrored, double in0, double in1,
                      std::size_t in_size, std::size_t size, bool resample) {
  const double scale = (in1 - in0) / static_cast<double>(size);
  const double filterscale = scale >= 1.0 ? scale : 1.0;
  const double support = filterscale;  // the triangle's support, 1, widened
  const double ss = 1.0 / filterscale;
  auto triangle = [ss](double x) {
    x *= ss;
    return x < 0 ? (x > -1.0 ? 1.0 + x : 0.0) : (x < 1.0 ? 1.0 - x : 0.0);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::ptrdiff_t r = offset + static_cast<std::ptrdiff_t>(mirrored ? n - 1 - i : i);
    float* w = a.w + i * a.taps;
    if (r < 0 || r >= static_cast<std::ptrdiff_t>(size)) {
      a.first[i] = 0, a.count[i] = 0;
      continue;
    }
    if (!resample) {
      a.first[i] = static_cast<std::int32_t>(static_cast<double>(r) + in0);
      a.count[i] = 1;
      w[0] = 1.0f;
      continue;
    }
    const double center = in0 + (static_cast<double>(r) + 0.5) * scale;
    auto xmin = static_cast<std::ptrdiff_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    auto xmax = static_cast<std::ptrdiff_t>(center + support + 0.5);
    if (xmax > static_cast<std::ptrdiff_t>(in_size)) xmax = static_cast<std::ptrdiff_t>(in_size);
    std::ptrdiff_t cnt = xmax - xmin;
    if (cnt > static_cast<std::ptrdiff_t>(a.taps)) cnt = static_cast<std::ptrdiff_t>(a.taps);
    if (cnt < 0) cnt = 0;
    double total = 0;
    for (std::ptrdiff_t k = 0; k < cnt; ++k) total += triangle(static_cast<double>(k + xmin) - center + 0.5);
    for (std::ptrdiff_t k = 0; k < cnt; ++k) {
      const double v = triangle(static_cast<double>(k + xmin) - center + 0.5);
      w[k] = static_cast<float>(total != 0.0 ? v / total : v);
    }
    a.first[i] = static_cast<std::int32_t>(xmin);
    a.count[i] = static_cast<std::int32_t>(cnt);
  }
}

/// The per-channel affine map from a resampled pixel value v (0..255) to the output:
/// v / 255 without normalize (`divide`), else v * a[c] + b[c].
struct pixel_map {
  bool divide = true;
  float a[3] = {1, 1, 1}, b[3] = {0, 0, 0};
};

inline pixel_map make_pixel_map(const image_composition& c) {
  pixel_map m;
  if (!c.normalize) return m;
  m.divide = false;
  for (std::size_t k = 0; k < 3; ++k) {
    const double mean = c.mean.v[c.mean.n == 1 ? 0 : k], sd = c.std.v[c.std.n == 1 ? 0 : k];
    m.a[k] = static_cast<float>(1.0 / (255.0 * sd));
    m.b[k] = static_cast<float>(-mean / sd);
  }
  return m;
}

/// Four floats in one vector register (GCC's and Clang's vector extension): one RGBX pixel.
typedef float float4 __attribute__((vector_size(16)));
inline float4 load4(const float* p) noexcept {
  float4 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(float* p, float4 v) noexcept { __builtin_memcpy(p, &v, sizeof v); }

/// The weighted sum w[0] p(0) + w[1] p(1) + ... + w[n-1] p(n-1), left to right; 0 for n = 0.
/// The one order of summation of both passes (and of the tests' unfused reference).
template <class T, class Load>
[[gnu::always_inline]] inline T tap_sum(const float* w, std::int32_t n, Load p) {
  if (n == 0) return T{};
  T v = w[0] * p(0);
  for (std::int32_t k = 1; k < n; ++k) v += w[k] * p(k);
  return v;
}

/// The fused pass: resamples rows (x taps) into scratch, then columns (y taps) into the output,
/// mapping each value to the output's float and writing it planar: out is (C, out_h, out_w).
/// Taps are relative to the region's first pixel. BPP: bytes per pixel (1 grey, 4 RGBX).
template <int BPP>
void resample_region(const pixel_region& reg, const axis_taps& xs, std::size_t out_w, const axis_taps& ys, std::size_t out_h,
                     int channels, const pixel_map& m, float* out, image_scratch& s) {
  const std::int32_t* const xfirst = xs.first;
  const std::int32_t* const xcount = xs.count;
  const float* const xw = xs.w;
  const std::size_t xtaps = xs.taps;
  // Rows and columns the taps read.
  std::int32_t r0 = INT32_MAX, r1 = 0, c0 = INT32_MAX, c1 = 0;
  for (std::size_t i = 0; i < out_h; ++i)
    if (ys.count[i]) r0 = std::min(r0, ys.first[i]), r1 = std::max(r1, ys.first[i] + ys.count[i]);
  for (std::size_t i = 0; i < out_w; ++i)
    if (xcount[i]) c0 = std::min(c0, xfirst[i]), c1 = std::max(c1, xfirst[i] + xcount[i]);
  const std::size_t plane = out_w * out_h;
  if (r0 >= r1 || c0 >= c1) {  // all padding
    for (int c = 0; c < channels; ++c) std::fill(out + c * plane, out + (c + 1) * plane, m.divide ? 0.0f : m.b[c]);
    return;
  }
  const std::size_t rows = static_cast<std::size_t>(r1 - r0), cols = static_cast<std::size_t>(c1 - c0);
  const std::size_t line = out_w * BPP;  // floats per resampled row
  // Scratch floats: [two rows converted to float | rows x line resampled rows].
  const std::size_t need = 2 * cols * BPP + rows * line + 16;
  if (s.floats.size() < need) s.floats.resize(need);
  float* const rowf0 = s.floats.data();
  float* const rowf1 = rowf0 + cols * BPP;
  float* const tmp = rowf1 + cols * BPP;

  // Pass 1: the rows the output needs, resampled along x, two rows at a time (the taps' loads
  // are shared, the two sums are independent).
  auto convert = [&](std::size_t r, float* f) {
    const std::uint8_t* src = reg.data + (static_cast<std::size_t>(r0) + r) * reg.stride + static_cast<std::size_t>(c0) * BPP;
    for (std::size_t j = 0; j < cols * BPP; ++j) f[j] = static_cast<float>(src[j]);
  };
  for (std::size_t r = 0; r < rows; r += 2) {
    const bool pair = r + 1 < rows;
    convert(r, rowf0);
    if (pair) convert(r + 1, rowf1);
    float* const d0 = tmp + r * line;
    float* const d1 = pair ? d0 + line : d0;  // the odd last row: computed twice, same values
    const float* const f1 = pair ? rowf1 : rowf0;
    for (std::size_t i = 0; i < out_w; ++i) {
      const float* w = xw + i * xtaps;
      const std::int32_t n = xcount[i];
      const std::size_t at = static_cast<std::size_t>(xfirst[i] - c0) * BPP;
      if constexpr (BPP == 4) {
        const float* p0 = rowf0 + at;
        const float* p1 = f1 + at;
        const float4 v0 = tap_sum<float4>(w, n, [&](std::int32_t k) { return load4(p0 + 4 * k); });
        const float4 v1 = tap_sum<float4>(w, n, [&](std::int32_t k) { return load4(p1 + 4 * k); });
        store4(d0 + 4 * i, v0);
        store4(d1 + 4 * i, v1);
      } else {
        const float* p0 = rowf0 + at;
        const float* p1 = f1 + at;
        d0[i] = tap_sum<float>(w, n, [&](std::int32_t k) { return p0[k]; });
        d1[i] = tap_sum<float>(w, n, [&](std::int32_t k) { return p1[k]; });
      }
    }
  }

  // Pass 2: each output row resampled along y, mapped and written planar.
  for (std::size_t o = 0; o < out_h; ++o) {
    const std::int32_t n = ys.count[o];
    float* const dst0 = out + o * out_w;
    if (n == 0) {
      for (int c = 0; c < channels; ++c) {
        float* dst = dst0 + static_cast<std::size_t>(c) * plane;
        std::fill(dst, dst + out_w, m.divide ? 0.0f : m.b[c]);
      }
      continue;
    }
    const float* const w = ys.w + o * ys.taps;
    const float* const t0 = tmp + static_cast<std::size_t>(ys.first[o] - r0) * line;
    if constexpr (BPP == 4) {
      auto pixel = [&](std::size_t i) {
        return tap_sum<float4>(w, n, [&](std::int32_t k) { return load4(t0 + static_cast<std::size_t>(k) * line + 4 * i); });
      };
      float* const dst1 = dst0 + plane;
      float* const dst2 = dst1 + plane;
      const float4 a = m.divide ? float4{1, 1, 1, 1} : float4{m.a[0], m.a[1], m.a[2], 0};
      const float4 b = m.divide ? float4{0, 0, 0, 0} : float4{m.b[0], m.b[1], m.b[2], 0};
      auto map = [&](float4 v) { return m.divide ? v / 255.0f : v * a + b; };
      std::size_t i = 0;
#if defined(__SSE2__)
      // Four pixels at a time: (R G B X) x 4 transposed to R x 4, G x 4, B x 4.
      for (; i + 4 <= out_w; i += 4) {
        __m128 p0 = static_cast<__m128>(map(pixel(i))), p1 = static_cast<__m128>(map(pixel(i + 1)));
        __m128 p2 = static_cast<__m128>(map(pixel(i + 2))), p3 = static_cast<__m128>(map(pixel(i + 3)));
        _MM_TRANSPOSE4_PS(p0, p1, p2, p3);
        _mm_storeu_ps(dst0 + i, p0);
        _mm_storeu_ps(dst1 + i, p1);
        _mm_storeu_ps(dst2 + i, p2);
      }
#endif
      for (; i < out_w; ++i) {
        const float4 v = map(pixel(i));
        dst0[i] = v[0], dst1[i] = v[1], dst2[i] = v[2];
      }
    } else {
      for (std::size_t i = 0; i < out_w; ++i) {
        const float v = tap_sum<float>(w, n, [&](std::int32_t k) { return t0[static_cast<std::size_t>(k) * line + i]; });
        dst0[i] = m.divide ? v / 255.0f : v * m.a[0] + m.b[0];
      }
    }
  }
}

/// The most scratch a decoding thread keeps between images: after a larger image its buffers
/// are given back, so that one huge file does not hold its memory for the rest of the run.
inline constexpr std::size_t image_scratch_keep_bytes = std::size_t{32} << 20;

/// Runs a pipeline (its composition c) on one encoded image: plan, decode the pixels the
/// taps need, resample, map, write (C, H, W) floats to out.
inline void run_image_pipeline(const image_composition& c, std::span<const std::byte> encoded, const sample_key& key,
                               float* out, image_scratch& s, std::size_t max_pixels) {
  image_reader reader(s, max_pixels);
  const image_header& hd = reader.open(encoded);
  const image_plan p = plan_image(c, hd, key);
  const image_geometry& g = p.geometry;

  // The window's pixels on each axis: [lo, hi) of the (reduced) image.
  const auto lo_x = static_cast<std::size_t>(std::floor(p.x0)), lo_y = static_cast<std::size_t>(std::floor(p.y0));
  const std::size_t hi_x = std::min(p.image_w, static_cast<std::size_t>(std::ceil(p.x1)));
  const std::size_t hi_y = std::min(p.image_h, static_cast<std::size_t>(std::ceil(p.y1)));
  const std::size_t kx = max_taps(p.x1 - p.x0, g.res_w, g.resample), ky = max_taps(p.y1 - p.y0, g.res_h, g.resample);
  const std::size_t ints = 2 * (g.out_w + g.out_h), floats = g.out_w * kx + g.out_h * ky;
  if (s.ints.size() < ints) s.ints.resize(ints);
  if (s.taps.size() < floats) s.taps.resize(floats);
  axis_taps xs{s.ints.data(), s.ints.data() + g.out_w, s.taps.data(), kx};
  axis_taps ys{s.ints.data() + 2 * g.out_w, s.ints.data() + 2 * g.out_w + g.out_h, s.taps.data() + g.out_w * kx, ky};
  fill_taps(xs, g.out_w, g.out_x, g.flip, p.x0 - static_cast<double>(lo_x), p.x1 - static_cast<double>(lo_x), hi_x - lo_x,
            g.res_w, g.resample);
  fill_taps(ys, g.out_h, g.out_y, false, p.y0 - static_cast<double>(lo_y), p.y1 - static_cast<double>(lo_y), hi_y - lo_y,
            g.res_h, g.resample);

  // Decode only the pixels the taps read (a JPEG: only its rows, and its columns widened to
  // the block grid); then the taps count from the region's first pixel.
  auto bounds = [](const axis_taps& a, std::size_t n, std::int32_t& b0, std::int32_t& b1) {
    b0 = INT32_MAX, b1 = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (a.count[i]) b0 = std::min(b0, a.first[i]), b1 = std::max(b1, a.first[i] + a.count[i]);
  };
  std::int32_t bx0, bx1, by0, by1;
  bounds(xs, g.out_w, bx0, bx1);
  bounds(ys, g.out_h, by0, by1);
  const pixel_map m = make_pixel_map(c);
  const int ch = static_cast<int>(c.channels);
  if (bx0 >= bx1 || by0 >= by1) {  // nothing but padding
    const std::size_t plane = g.out_w * g.out_h;
    for (int k = 0; k < ch; ++k) std::fill(out + k * plane, out + (k + 1) * plane, m.divide ? 0.0f : m.b[k]);
    detail::decode_scratch_bytes() = s.bytes();
    return;
  }
  region_request req;
  req.channels = ch;
  req.reduction = p.reduction;
  req.x = lo_x + static_cast<std::size_t>(bx0);
  req.y = lo_y + static_cast<std::size_t>(by0);
  req.width = static_cast<std::size_t>(bx1 - bx0);
  req.height = static_cast<std::size_t>(by1 - by0);
  const pixel_region reg = reader.decode(req);
  const auto shift_x = static_cast<std::int32_t>(static_cast<std::ptrdiff_t>(lo_x) - static_cast<std::ptrdiff_t>(reg.x0));
  const auto shift_y = static_cast<std::int32_t>(static_cast<std::ptrdiff_t>(lo_y) - static_cast<std::ptrdiff_t>(reg.y0));
  for (std::size_t i = 0; i < g.out_w; ++i) xs.first[i] += shift_x;
  for (std::size_t i = 0; i < g.out_h; ++i) ys.first[i] += shift_y;
  if (ch == 1)
    resample_region<1>(reg, xs, g.out_w, ys, g.out_h, ch, m, out, s);
  else
    resample_region<4>(reg, xs, g.out_w, ys, g.out_h, ch, m, out, s);
  // An unusually large image (a whole PNG of many megapixels) leaves no lasting scratch behind.
  if (s.bytes() > image_scratch_keep_bytes) s.release();
  detail::decode_scratch_bytes() = s.bytes();
}

}  // namespace detail

/// A decoding and augmentation pipeline: `Steps` in the order channels, expect_size, one of
/// resize / random_resized_crop, one of center_crop / random_crop, horizontal_flip,
/// normalize (each optional but channels). Its output is output_shape = shape<C, H, W>, float,
/// planar (channel by channel), known at compile time; the trainer checks it against the
/// network's input shape.
///
/// Calls are const and thread-safe: each thread decodes into its own scratch (the calling
/// thread's, or one given). The random draws of a sample depend only on its sample_key: the
/// same key gives the same floats, bit for bit, on any thread, in any order.
template <class... Steps>
class image_pipeline {
  // The check runs where the composition is first needed (output_shape needs it): its
  // static_asserts report a wrong pipeline once, and the composition of a wrong one is a
  // harmless 1 x 1 x 1 so that nothing else fails after them.
  static constexpr detail::image_composition c_ =
      (detail::check_image_pipeline<Steps...>(), detail::compose_image_steps<Steps...>());

 public:
  static constexpr std::size_t channels = c_.channels, height = c_.height, width = c_.width;
  /// (C, H, W).
  using output_shape = shape<channels, height, width>;
  using sample_shape = output_shape;

  /// max_pixels: images with more pixels are a bad_image before anything is decoded.
  explicit image_pipeline(std::size_t max_pixels = default_max_image_pixels) noexcept : max_pixels_(max_pixels) {}

  /// Decodes `encoded` (a JPEG or PNG file) and writes output_shape::size floats to out.
  /// Throws: bad_image (corrupt, truncated, unsupported, too large, or not fitting the steps).
  void operator()(std::span<const std::byte> encoded, const sample_key& key, float* out) const {
    (*this)(encoded, key, out, this_thread_image_scratch());
  }
  /// The same with the caller's scratch.
  void operator()(std::span<const std::byte> encoded, const sample_key& key, float* out, image_scratch& scratch) const {
    detail::run_image_pipeline(c_, encoded, key, out, scratch, max_pixels_);
  }

  /// The plan the sample `key` of an image with header `h` gets (for tests and tools).
  /// Throws: bad_image when the image does not fit the steps.
  image_plan plan(const image_header& h, const sample_key& key) const { return detail::plan_image(c_, h, key); }

  /// "image_pipeline<rgb, random_resized_crop<224, 224>, horizontal_flip<0.500000>, normalize>".
  static std::string describe() {
    std::string s = "image_pipeline<";
    bool first = true;
    ((s += (first ? "" : ", ") + Steps::name(), first = false), ...);
    return s + ">";
  }

  /// The largest number of pixels an image may have.
  std::size_t max_pixels() const noexcept { return max_pixels_; }

 private:
  std::size_t max_pixels_;
};

/// Decode to C channels (1 grey, 3 RGB) of exactly H x W pixels, written as pixel / 255 —
/// bit for bit what the IDX loaders write for the same pixels.
template <std::size_t C, std::size_t H, std::size_t W>
using decode_to = image_pipeline<channels<C>, expect_size<H, W>>;

}  // namespace loom::data
