// SPDX-License-Identifier: Apache-2.0
// Image pipelines (loom/data/image_pipeline.hpp): output shapes at compile time; the fused pass
// against a plain unfused reference (decode, crop, resize, pad, flip, normalize, one step at a
// time) bit for bit, for every step and both formats, DCT-reduced JPEGs included; torchvision's
// semantics of each random step; determinism by sample_key; the IDX path's pixel / 255 exactly;
// torchvision's own outputs when its Python environment exists; bad images.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "error_message.hpp"
#include "image_files.hpp"
#include "loom/data/dataset.hpp"
#include "loom/data/image_pipeline.hpp"
#include "loom/data/loader.hpp"

using namespace loom::data;
using loom::testing::error_message;
using loom_test::bytes;
using loom_test::view;
using Catch::Matchers::Contains;

namespace {

// ---- The unfused reference: each step on its own, on whole images of floats. ----------------

// h x w pixels of c channels, interleaved.
struct fimage {
  std::size_t w = 0, h = 0;
  int c = 1;
  std::vector<float> v;
  float& at(std::size_t x, std::size_t y, int k) { return v[(y * w + x) * static_cast<std::size_t>(c) + static_cast<std::size_t>(k)]; }
  float at(std::size_t x, std::size_t y, int k) const { return v[(y * w + x) * static_cast<std::size_t>(c) + static_cast<std::size_t>(k)]; }
};

// PIL's and torchvision's antialiased bilinear coefficients for `size` outputs from the window
// [in0, in1) of in_size pixels (written again, plainly, from PIL's precompute_coeffs).
struct coefficients {
  std::vector<std::ptrdiff_t> first;
  std::vector<std::vector<float>> w;
};
coefficients bilinear_aa(double in0, double in1, std::size_t in_size, std::size_t size) {
  coefficients co;
  const double scale = (in1 - in0) / static_cast<double>(size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  for (std::size_t i = 0; i < size; ++i) {
    const double center = in0 + (static_cast<double>(i) + 0.5) * scale;
    const auto xmin = std::max<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(center - support + 0.5), 0);
    const auto xmax = std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(center + support + 0.5), static_cast<std::ptrdiff_t>(in_size));
    std::vector<double> k;
    double total = 0;
    for (std::ptrdiff_t x = xmin; x < xmax; ++x) {
      const double t = std::abs((static_cast<double>(x) - center + 0.5) / filterscale);
      k.push_back(t < 1.0 ? 1.0 - t : 0.0);
      total += k.back();
    }
    co.first.push_back(xmin);
    co.w.emplace_back();
    for (double v : k) co.w.back().push_back(static_cast<float>(total != 0 ? v / total : v));
  }
  return co;
}

// Resampling along x, then along y; each output a left-to-right sum of weight x pixel.
fimage resized(const fimage& in, double x0, double x1, double y0, double y1, std::size_t w, std::size_t h) {
  const coefficients cx = bilinear_aa(x0, x1, in.w, w), cy = bilinear_aa(y0, y1, in.h, h);
  fimage mid{w, in.h, in.c, std::vector<float>(w * in.h * static_cast<std::size_t>(in.c))};
  for (std::size_t y = 0; y < in.h; ++y)
    for (std::size_t x = 0; x < w; ++x)
      for (int k = 0; k < in.c; ++k) {
        float s = 0;
        for (std::size_t t = 0; t < cx.w[x].size(); ++t) {
          const float p = cx.w[x][t] * in.at(static_cast<std::size_t>(cx.first[x]) + t, y, k);
          s = t == 0 ? p : s + p;
        }
        mid.at(x, y, k) = s;
      }
  fimage out{w, h, in.c, std::vector<float>(w * h * static_cast<std::size_t>(in.c))};
  for (std::size_t y = 0; y < h; ++y)
    for (std::size_t x = 0; x < w; ++x)
      for (int k = 0; k < in.c; ++k) {
        float s = 0;
        for (std::size_t t = 0; t < cy.w[y].size(); ++t) {
          const float p = cy.w[y][t] * mid.at(x, static_cast<std::size_t>(cy.first[y]) + t, k);
          s = t == 0 ? p : s + p;
        }
        out.at(x, y, k) = s;
      }
  return out;
}

// The w x h window at (x, y), zero outside the image.
fimage pad_crop(const fimage& in, std::ptrdiff_t x, std::ptrdiff_t y, std::size_t w, std::size_t h) {
  fimage out{w, h, in.c, std::vector<float>(w * h * static_cast<std::size_t>(in.c), 0.0f)};
  for (std::size_t j = 0; j < h; ++j)
    for (std::size_t i = 0; i < w; ++i) {
      const std::ptrdiff_t sx = x + static_cast<std::ptrdiff_t>(i), sy = y + static_cast<std::ptrdiff_t>(j);
      if (sx < 0 || sy < 0 || sx >= static_cast<std::ptrdiff_t>(in.w) || sy >= static_cast<std::ptrdiff_t>(in.h)) continue;
      for (int k = 0; k < in.c; ++k) out.at(i, j, k) = in.at(static_cast<std::size_t>(sx), static_cast<std::size_t>(sy), k);
    }
  return out;
}

fimage mirror(const fimage& in) {
  fimage out = in;
  for (std::size_t y = 0; y < in.h; ++y)
    for (std::size_t x = 0; x < in.w; ++x)
      for (int k = 0; k < in.c; ++k) out.at(x, y, k) = in.at(in.w - 1 - x, y, k);
  return out;
}

// (C, H, W): pixel / 255, or pixel * a + b with a = 1 / (255 std), b = -mean / std.
std::vector<float> to_chw(const fimage& in, const std::vector<double>& mean, const std::vector<double>& sd) {
  std::vector<float> out(in.w * in.h * static_cast<std::size_t>(in.c));
  for (int k = 0; k < in.c; ++k)
    for (std::size_t y = 0; y < in.h; ++y)
      for (std::size_t x = 0; x < in.w; ++x) {
        const float v = in.at(x, y, k);
        float& o = out[(static_cast<std::size_t>(k) * in.h + y) * in.w + x];
        if (mean.empty()) {
          o = v / 255.0f;
        } else {
          const auto a = static_cast<float>(1.0 / (255.0 * sd[static_cast<std::size_t>(k)]));
          const auto b = static_cast<float>(-mean[static_cast<std::size_t>(k)] / sd[static_cast<std::size_t>(k)]);
          o = v * a + b;
        }
      }
  return out;
}

image_header header_of(const bytes& file) {
  image_scratch s;
  return image_reader(s).open(view(file));
}

// The whole reference for one sample: its plan from the pipeline (the random draws; their
// semantics are tested apart), everything else computed here.
template <class P>
std::vector<float> reference(const P& pipeline, const bytes& file, const sample_key& key, const std::vector<double>& mean = {},
                             const std::vector<double>& sd = {}) {
  constexpr int c = static_cast<int>(P::channels);
  const image_header hd = header_of(file);
  const image_plan p = pipeline.plan(hd, key);
  const image_geometry& g = p.geometry;
  // The decoded image at the plan's reduction: TurboJPEG's for a JPEG (the reader's equal, as
  // image_decode_test shows), the reader's full decode for a PNG.
  std::vector<std::uint8_t> px = hd.format == image_format::jpeg ? loom_test::turbojpeg_decode(file, c, p.reduction)
                                                                  : decode_image(view(file), c);
  fimage img{p.image_w, p.image_h, c, std::vector<float>(px.begin(), px.end())};
  fimage res;
  if (g.resample) {
    const auto lo_x = static_cast<std::size_t>(std::floor(p.x0)), lo_y = static_cast<std::size_t>(std::floor(p.y0));
    const std::size_t hi_x = std::min(p.image_w, static_cast<std::size_t>(std::ceil(p.x1)));
    const std::size_t hi_y = std::min(p.image_h, static_cast<std::size_t>(std::ceil(p.y1)));
    const fimage window = pad_crop(img, static_cast<std::ptrdiff_t>(lo_x), static_cast<std::ptrdiff_t>(lo_y), hi_x - lo_x, hi_y - lo_y);
    res = resized(window, p.x0 - static_cast<double>(lo_x), p.x1 - static_cast<double>(lo_x), p.y0 - static_cast<double>(lo_y),
                 p.y1 - static_cast<double>(lo_y), g.res_w, g.res_h);
  } else {
    res = img;
  }
  fimage out = pad_crop(res, g.out_x, g.out_y, g.out_w, g.out_h);
  if (g.flip) out = mirror(out);
  return to_chw(out, mean, sd);
}

template <class P>
std::vector<float> run(const P& pipeline, const bytes& file, const sample_key& key) {
  std::vector<float> out(P::output_shape::size, -1.0f);
  pipeline(view(file), key, out.data());
  return out;
}

std::size_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

const std::vector<double> imagenet_mean = {0.485, 0.456, 0.406}, imagenet_std = {0.229, 0.224, 0.225};

}  // namespace

TEST_CASE("A pipeline's output shape is known at compile time", "[data][image][pipeline]") {
  using train = image_pipeline<rgb, random_resized_crop<224>, flip, imagenet_normalize>;
  using eval = image_pipeline<rgb, resize<256>, center_crop<224>, imagenet_normalize>;
  using cifar = image_pipeline<rgb, expect_size<32>, random_crop<32, 32, 4>, flip,
                               normalize<{0.4914, 0.4822, 0.4465}, {0.247, 0.243, 0.261}>>;
  using wide = image_pipeline<gray, resize<48, 64>>;
  STATIC_REQUIRE(std::is_same_v<train::output_shape, loom::shape<3, 224, 224>>);
  STATIC_REQUIRE(std::is_same_v<eval::output_shape, loom::shape<3, 224, 224>>);
  STATIC_REQUIRE(std::is_same_v<cifar::output_shape, loom::shape<3, 32, 32>>);
  STATIC_REQUIRE(std::is_same_v<wide::output_shape, loom::shape<1, 48, 64>>);
  STATIC_REQUIRE(std::is_same_v<decode_to<1, 28, 28>::output_shape, loom::shape<1, 28, 28>>);
  STATIC_REQUIRE(std::is_same_v<image_pipeline<rgb, expect_size<40, 30>, resize<20>>::output_shape, loom::shape<3, 26, 20>>);
  CHECK(train::describe() == "image_pipeline<rgb, random_resized_crop<224, 224>, horizontal_flip<0.500000>, normalize>");
}

TEST_CASE("decode_to<1, 28, 28> writes what the IDX path writes for the same pixels, bit for bit", "[data][image][pipeline]") {
  const std::size_t n = 50;
  const auto pixels = loom_test::photo_pixels(28, 28 * n, 1, 77);
  loom::data::fashion_mnist_set set(pixels, std::vector<std::uint8_t>(n, 0));
  decode_to<1, 28, 28> pipeline;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<std::uint8_t> one(pixels.begin() + static_cast<std::ptrdiff_t>(i * 784),
                                        pixels.begin() + static_cast<std::ptrdiff_t>((i + 1) * 784));
    std::vector<float> idx(784), png(784);
    loom::data::detail::write_pixels(set, i, idx.data());
    pipeline(view(loom_test::png_of(one, 28, 28, 1)), {1, 0, i}, png.data());
    REQUIRE(mismatches(idx, png) == 0);
  }
  CHECK_THAT(error_message<bad_image>([&] {
               std::vector<float> out(784);
               const std::vector<std::uint8_t> two(pixels.begin(), pixels.begin() + 2 * 784);
               pipeline(view(loom_test::png_of(two, 28, 56, 1)), {}, out.data());
             }),
             Contains("PNG image of 28 x 56 pixels: expected exactly 28 x 28 pixels (expect_size<28, 28>)"));
}

TEST_CASE("The fused pass equals the unfused steps bit for bit", "[data][image][pipeline]") {
  const bytes jpeg = loom_test::photo_jpeg(256, 256, 31);
  const bytes jpeg_odd = loom_test::photo_jpeg(333, 197, 32, 3, 85, TJSAMP_422);
  const bytes jpeg_grey = loom_test::photo_jpeg(120, 90, 33, 1);
  const bytes jpeg_large = loom_test::photo_jpeg(1800, 1350, 34);  // DCT-reduced 2, 4 or 8 times
  const bytes png = loom_test::png_of(loom_test::photo_pixels(150, 110, 3, 35), 150, 110, 3);
  const bytes png_grey = loom_test::png_of(loom_test::photo_pixels(64, 80, 1, 36), 64, 80, 1);
  const bytes cifar = loom_test::png_of(loom_test::photo_pixels(32, 32, 3, 37), 32, 32, 3);

  auto check = [&](const auto& pipeline, const bytes& file, const char* what, const std::vector<double>& mean,
                   const std::vector<double>& sd, std::size_t keys = 24) {
    std::set<unsigned> reductions;
    for (std::uint64_t i = 0; i < keys; ++i) {
      const sample_key key{5, i % 3, 1000 + i};
      INFO(what << ", sample " << key.index << " epoch " << key.epoch);
      reductions.insert(pipeline.plan(header_of(file), key).reduction);
      REQUIRE(mismatches(run(pipeline, file, key), reference(pipeline, file, key, mean, sd)) == 0);
    }
    return reductions;
  };
  const std::vector<double> none;
  SECTION("random_resized_crop, flip, normalize") {
    const image_pipeline<rgb, random_resized_crop<224>, flip, imagenet_normalize> p;
    check(p, jpeg, "256 x 256 JPEG", imagenet_mean, imagenet_std);
    check(p, jpeg_odd, "333 x 197 JPEG (4:2:2)", imagenet_mean, imagenet_std);
    check(p, png, "150 x 110 PNG", imagenet_mean, imagenet_std);
    check(p, jpeg_grey, "grey JPEG to RGB", imagenet_mean, imagenet_std);
    const auto reductions = check(image_pipeline<rgb, random_resized_crop<64>, flip, imagenet_normalize>{}, jpeg_large,
                                  "1800 x 1350 JPEG to 64 x 64", imagenet_mean, imagenet_std, 24);
    CHECK(reductions.size() >= 2);  // DCT reduction took part
    CHECK(reductions.count(8) == 1);
  }
  SECTION("resize (shorter side), center_crop, normalize; grey") {
    check(image_pipeline<rgb, resize<96>, center_crop<80, 72>, imagenet_normalize>{}, jpeg_odd, "JPEG", imagenet_mean,
          imagenet_std, 2);
    check(image_pipeline<rgb, resize<100>, center_crop<64>>{}, png, "PNG", none, none, 2);
    check(image_pipeline<gray, resize<40>, center_crop<40>, normalize<0.5, 0.25>>{}, png_grey, "grey PNG", {0.5}, {0.25}, 2);
    check(image_pipeline<gray, resize<200>, center_crop<150>>{}, jpeg_odd, "RGB JPEG to grey, enlarged", none, none, 2);
    check(image_pipeline<rgb, resize<224>, center_crop<224>>{}, jpeg_large, "1800 x 1350 JPEG reduced", none, none, 2);
  }
  SECTION("resize to a fixed size; center_crop alone; expect_size alone") {
    check(image_pipeline<rgb, resize<50, 70>, flip>{}, jpeg, "JPEG", none, none, 8);
    check(image_pipeline<rgb, center_crop<100, 120>>{}, jpeg_odd, "JPEG", none, none, 2);
    check(image_pipeline<gray, expect_size<80, 64>>{}, png_grey, "grey PNG", none, none, 2);
  }
  SECTION("random_crop with padding, flip, normalize (CIFAR)") {
    check(image_pipeline<rgb, expect_size<32>, random_crop<32, 32, 4>, flip, normalize<{0.4914, 0.4822, 0.4465}, {0.247, 0.243, 0.261}>>{},
          cifar, "32 x 32 PNG", {0.4914, 0.4822, 0.4465}, {0.247, 0.243, 0.261}, 64);
    check(image_pipeline<gray, random_crop<90, 90, 20>>{}, png_grey, "grey PNG, padded on one axis", none, none, 16);
    check(image_pipeline<rgb, resize<40>, random_crop<48, 48, 6>, flip>{}, jpeg, "resized, then padded", none, none, 16);
  }
}

TEST_CASE("Normalisation is (pixel / 255 - mean) / std within float rounding", "[data][image][pipeline]") {
  const bytes png = loom_test::png_of(loom_test::photo_pixels(20, 20, 3, 41), 20, 20, 3);
  std::vector<float> plain(1200), norm(1200);
  image_pipeline<rgb, expect_size<20>>{}(view(png), {}, plain.data());
  image_pipeline<rgb, expect_size<20>, imagenet_normalize>{}(view(png), {}, norm.data());
  for (std::size_t i = 0; i < 1200; ++i) {
    const std::size_t c = i / 400;
    REQUIRE(std::abs(norm[i] - static_cast<float>((plain[i] - imagenet_mean[c]) / imagenet_std[c])) < 1e-6f * 4);
  }
}

TEST_CASE("Random steps follow torchvision's rules", "[data][image][pipeline]") {
  const image_pipeline<rgb, random_resized_crop<224>, flip> rrc;
  const image_header photo{image_format::jpeg, 400, 300, 3, 8};
  SECTION("random_resized_crop: area in [0.08, 1] and aspect in [3/4, 4/3] of the image, inside it, or the centred fallback") {
    double area_sum = 0;
    std::size_t flips = 0, n = 3000;
    for (std::uint64_t i = 0; i < n; ++i) {
      const image_geometry g = rrc.plan(photo, {9, 1, i}).geometry;
      REQUIRE(g.src_x + g.src_w <= 400);
      REQUIRE(g.src_y + g.src_h <= 300);
      const double area = double(g.src_w * g.src_h) / (400.0 * 300.0), aspect = double(g.src_w) / double(g.src_h);
      // Rounding the sides to pixels moves both a little.
      REQUIRE(area >= 0.08 * 0.97);
      REQUIRE(area <= 1.0);
      REQUIRE(aspect >= 0.75 * 0.97);
      REQUIRE(aspect <= 4.0 / 3.0 * 1.03);
      CHECK(g.res_w == 224);
      area_sum += area;
      flips += g.flip;
    }
    // Tries whose window does not fit are redrawn, so large areas are rarer than uniform:
    // torchvision's mean area fraction on a 4:3 image is about 0.47.
    CHECK(area_sum / double(n) > 0.40);
    CHECK(area_sum / double(n) < 0.56);
    CHECK(double(flips) / double(n) > 0.46);
    CHECK(double(flips) / double(n) < 0.54);
  }
  SECTION("an image no window fits gets torchvision's fallback: the centred crop of the nearest allowed ratio") {
    const image_geometry wide = rrc.plan({image_format::png, 1000, 10, 3, 8}, {1, 0, 0}).geometry;
    CHECK(wide.src_h == 10);
    CHECK(wide.src_w == 13);  // round(10 * 4 / 3)
    CHECK(wide.src_x == (1000 - 13) / 2);
    CHECK(wide.src_y == 0);
    const image_geometry tall = rrc.plan({image_format::png, 10, 1000, 3, 8}, {1, 0, 0}).geometry;
    CHECK(tall.src_w == 10);
    CHECK(tall.src_h == 13);  // round(10 / (3 / 4))
    CHECK(tall.src_y == (1000 - 13) / 2);
  }
  SECTION("center_crop's offset rounds half to even, as Python's round") {
    const image_pipeline<rgb, center_crop<224>> cc;
    CHECK(cc.plan({image_format::png, 225, 225, 3, 8}, {}).geometry.out_x == 0);  // round(0.5) = 0
    CHECK(cc.plan({image_format::png, 227, 225, 3, 8}, {}).geometry.out_x == 2);  // round(1.5) = 2
    CHECK(cc.plan({image_format::png, 229, 224, 3, 8}, {}).geometry.out_x == 2);  // round(2.5) = 2
    CHECK(cc.plan({image_format::png, 256, 300, 3, 8}, {}).geometry.out_y == 38);
  }
  SECTION("resize<S> gives the shorter side S and the longer int(S * longer / shorter)") {
    const image_pipeline<rgb, resize<256>, center_crop<224>> r;
    const image_geometry g = r.plan({image_format::png, 500, 375, 3, 8}, {}).geometry;
    CHECK(g.res_h == 256);
    CHECK(g.res_w == 341);
    const image_geometry t = r.plan({image_format::png, 333, 500, 3, 8}, {}).geometry;
    CHECK(t.res_w == 256);
    CHECK(t.res_h == 384);
  }
  SECTION("random_crop with padding 4 takes every offset from -4 to +4 on a 32 x 32 image") {
    const image_pipeline<rgb, expect_size<32>, random_crop<32, 32, 4>> rc;
    std::map<std::ptrdiff_t, int> xs, ys;
    for (std::uint64_t i = 0; i < 2000; ++i) {
      const image_geometry g = rc.plan({image_format::png, 32, 32, 3, 8}, {3, 2, i}).geometry;
      ++xs[g.out_x], ++ys[g.out_y];
    }
    CHECK(xs.size() == 9);
    CHECK(ys.size() == 9);
    CHECK(xs.begin()->first == -4);
    CHECK(xs.rbegin()->first == 4);
    for (const auto& [offset, count] : xs) CHECK(count > 2000 / 9 / 2);
  }
}

TEST_CASE("A sample's draws are a function of its sample_key alone", "[data][image][pipeline]") {
  const image_pipeline<rgb, random_resized_crop<96>, flip, imagenet_normalize> p;
  const bytes jpeg = loom_test::photo_jpeg(160, 120, 51);
  const auto a = run(p, jpeg, {7, 2, 40});
  CHECK(mismatches(a, run(p, jpeg, {7, 2, 40})) == 0);
  // Another scratch, another thread: the same floats.
  std::vector<float> b(a.size());
  std::thread([&] {
    image_scratch s;
    p(view(jpeg), {7, 2, 40}, b.data(), s);
  }).join();
  CHECK(mismatches(a, b) == 0);
  CHECK(mismatches(a, run(p, jpeg, {7, 3, 40})) > 0);
  CHECK(mismatches(a, run(p, jpeg, {7, 2, 41})) > 0);
  CHECK(mismatches(a, run(p, jpeg, {8, 2, 40})) > 0);
}

TEST_CASE("Images the steps cannot crop are bad_image exceptions naming both sizes", "[data][image][pipeline][errors]") {
  std::vector<float> out(3 * 224 * 224);
  const bytes small = loom_test::png_of(loom_test::photo_pixels(200, 300, 3, 61), 200, 300, 3);
  CHECK_THAT(error_message<bad_image>([&] { image_pipeline<rgb, center_crop<224>>{}(view(small), {}, out.data()); }),
             Contains("PNG image of 200 x 300 pixels: center_crop<224, 224> needs at least 224 x 224 pixels, found 200 x 300"));
  const bytes tiny = loom_test::png_of(loom_test::photo_pixels(20, 40, 3, 62), 20, 40, 3);
  CHECK_THAT(error_message<bad_image>([&] { image_pipeline<rgb, random_crop<32, 32, 4>>{}(view(tiny), {}, out.data()); }),
             Contains("PNG image of 20 x 40 pixels: random_crop<32, 32, 4> needs at least 24 x 24 pixels (with 4 pixels of "
                      "padding on each side), found 20 x 40"));
  // A huge image is refused before it is decoded (the pipeline's pixel limit).
  const image_pipeline<rgb, random_resized_crop<16>> limited(100 * 100);
  CHECK_THAT(error_message<bad_image>([&] { limited(view(small), {}, out.data()); }), Contains("expected at most 10000 pixels"));
}

TEST_CASE("The outputs match torchvision's (when its Python environment exists)", "[data][image][torchvision]") {
  namespace fs = std::filesystem;
  const char* env = std::getenv("LOOM_DATA_BENCH_VENV");
  const char* home = std::getenv("HOME");
  const fs::path venv = env && *env ? fs::path(env) : fs::path(home ? home : "/root") / ".cache/loom/data-bench-venv";
  const fs::path py = venv / "bin/python";
  if (!fs::exists(py) || std::system((py.string() + " -c 'import torchvision' >/dev/null 2>&1").c_str()) != 0) {
    WARN("skipped: no Python with torchvision at " << py.string() << " (make it with benchmarks/data/make_venv.sh)");
    std::exit(77);
  }
  const fs::path dir = fs::temp_directory_path() / ("loom_image_tv_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::size_t w = 300, h = 220;
  const auto pixels = loom_test::photo_pixels(w, h, 3, 71);
  const bytes png = loom_test::png_of(pixels, w, h, 3);
  std::ofstream(dir / "img.raw", std::ios::binary).write(reinterpret_cast<const char*>(pixels.data()), static_cast<std::streamsize>(pixels.size()));
  // The crops the pipeline draws, given to torchvision's functional ops.
  const image_pipeline<rgb, random_resized_crop<128, 96>, flip, imagenet_normalize> rrc;
  std::string boxes;
  const image_header hd{image_format::png, w, h, 3, 8};
  for (std::uint64_t i = 0; i < 6; ++i) {
    const image_geometry g = rrc.plan(hd, {1, 0, i}).geometry;
    boxes += std::to_string(g.src_y) + "," + std::to_string(g.src_x) + "," + std::to_string(g.src_h) + "," +
             std::to_string(g.src_w) + "," + std::to_string(int(g.flip)) + ";";
  }
  boxes.pop_back();
  const std::string script = R"(
import sys, numpy as np, torch
import torchvision.transforms.v2.functional as F
from torchvision.transforms.v2 import Resize, CenterCrop
d = sys.argv[1]; w, h = int(sys.argv[2]), int(sys.argv[3])
img = torch.from_numpy(np.fromfile(d + '/img.raw', np.uint8).reshape(h, w, 3)).permute(2, 0, 1).float()
mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
outs = []
for box in sys.argv[4].split(';'):
    t, l, bh, bw, fl = map(int, box.split(','))
    x = F.resized_crop(img, t, l, bh, bw, [128, 96], antialias=True)
    if fl: x = F.horizontal_flip(x)
    outs.append(F.normalize(x / 255, mean, std).flatten())
x = CenterCrop(112)(Resize(120, antialias=True)(img)) / 255
outs.append(x.flatten())
torch.cat(outs).numpy().astype(np.float32).tofile(d + '/out.raw')
)";
  std::ofstream(dir / "tv.py") << script;
  const std::string cmd = py.string() + " " + (dir / "tv.py").string() + " " + dir.string() + " " + std::to_string(w) + " " +
                          std::to_string(h) + " '" + boxes + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream f(dir / "out.raw", std::ios::binary);
  std::vector<float> tv((6 * 3 * 128 * 96) + 3 * 112 * 112);
  f.read(reinterpret_cast<char*>(tv.data()), static_cast<std::streamsize>(tv.size() * sizeof(float)));
  REQUIRE(f.gcount() == static_cast<std::streamsize>(tv.size() * sizeof(float)));
  float worst = 0;
  for (std::uint64_t i = 0; i < 6; ++i) {
    const auto mine = run(rrc, png, {1, 0, i});
    for (std::size_t j = 0; j < mine.size(); ++j) worst = std::max(worst, std::abs(mine[j] - tv[i * mine.size() + j]));
  }
  CHECK(worst < 1e-4f);  // the same coefficients, float sums in another order
  const auto eval = run(image_pipeline<rgb, resize<120>, center_crop<112>>{}, png, {});
  float worst_eval = 0;
  for (std::size_t j = 0; j < eval.size(); ++j) worst_eval = std::max(worst_eval, std::abs(eval[j] - tv[6 * 3 * 128 * 96 + j]));
  CHECK(worst_eval < 1e-5f);
  fs::remove_all(dir);
}

TEST_CASE("A thread's scratch is reported, and given back after an unusually large image", "[data][image][pipeline]") {
  image_scratch s;
  std::vector<float> out(3 * 32 * 32);
  const image_pipeline<rgb, resize<32>, center_crop<32>> p;
  p(view(loom_test::photo_jpeg(300, 200, 81)), {}, out.data(), s);
  CHECK(s.bytes() > 0);
  CHECK(loom::data::detail::decode_scratch_bytes() == s.bytes());
  // 3000 x 3000 grey PNG decoded as RGBA: 36 MB, more than a thread keeps.
  const bytes big = loom_test::png_of(std::vector<std::uint8_t>(3000 * 3000, 7), 3000, 3000, 1);
  p(view(big), {}, out.data(), s);
  CHECK(out[0] == Approx(7.0 / 255.0).epsilon(1e-5));  // weights sum to 1 within float rounding
  CHECK(s.bytes() <= loom::data::detail::image_scratch_keep_bytes);
  CHECK(loom::data::detail::decode_scratch_bytes() == s.bytes());
}
