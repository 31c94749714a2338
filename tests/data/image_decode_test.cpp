// SPDX-License-Identifier: Apache-2.0
// The JPEG and PNG readers (loom/data/image.hpp): PNGs of every colour type and bit depth decode
// to exactly their pixels; JPEGs to exactly TurboJPEG's plain full decode, whole, as a window
// and reduced in the DCT domain; Pillow's decode of the same files when Python has Pillow; and
// every kind of bad input is a bad_image that says what was expected and found.

#include <catch2/catch.hpp>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "error_message.hpp"
#include "image_files.hpp"
#include "loom/data/image.hpp"

using namespace loom::data;
using loom::testing::error_message;
using loom_test::bytes;
using loom_test::view;
using Catch::Matchers::Contains;

namespace {

// Every pixel of the region's window [x, x + w) x [y, y + h) against `ref` (ref_w wide, c channels).
std::size_t differences(const pixel_region& r, std::size_t x, std::size_t y, std::size_t w, std::size_t h,
                        const std::vector<std::uint8_t>& ref, std::size_t ref_w, int c) {
  std::size_t n = 0;
  for (std::size_t yy = y; yy < y + h; ++yy)
    for (std::size_t xx = x; xx < x + w; ++xx)
      for (int k = 0; k < c; ++k)
        n += r.at(xx, yy, k) != ref[(yy * ref_w + xx) * static_cast<std::size_t>(c) + static_cast<std::size_t>(k)];
  return n;
}

}  // namespace

TEST_CASE("An 8-bit grey or RGB PNG decodes to exactly its pixels, in 1 or 3 channels", "[data][image][png]") {
  const std::size_t w = 37, h = 23;
  const auto grey = loom_test::photo_pixels(w, h, 1, 1);
  const auto rgb = loom_test::photo_pixels(w, h, 3, 2);
  CHECK(decode_image(view(loom_test::png_of(grey, w, h, 1)), 1) == grey);
  CHECK(decode_image(view(loom_test::png_of(rgb, w, h, 3)), 3) == rgb);
  // Grey to RGB repeats the grey; RGB to grey is PIL's luma.
  std::vector<std::uint8_t> grey3, luma;
  for (std::uint8_t v : grey) grey3.insert(grey3.end(), {v, v, v});
  for (std::size_t i = 0; i < w * h; ++i)
    luma.push_back(static_cast<std::uint8_t>((19595u * rgb[3 * i] + 38470u * rgb[3 * i + 1] + 7471u * rgb[3 * i + 2] + 32768u) >> 16));
  CHECK(decode_image(view(loom_test::png_of(grey, w, h, 1)), 3) == grey3);
  CHECK(decode_image(view(loom_test::png_of(rgb, w, h, 3)), 1) == luma);
  image_header hd;
  decode_image(view(loom_test::png_of(rgb, w, h, 3)), 3, &hd);
  CHECK(hd.format == image_format::png);
  CHECK(hd.width == w);
  CHECK(hd.height == h);
  CHECK(hd.channels == 3);
}

TEST_CASE("PNGs with alpha, 16 bits, a palette, few bits or interlacing decode as documented", "[data][image][png]") {
  const std::uint32_t w = 9, h = 5;
  const std::size_t n = w * h;
  std::vector<std::uint8_t> rgba(n * 4), ga(n * 2), rgb16(n * 6), g16(n * 2), indexed(n), bits(static_cast<std::size_t>((w + 7) / 8) * h);
  for (std::size_t i = 0; i < n; ++i) {
    for (int k = 0; k < 4; ++k) rgba[4 * i + k] = static_cast<std::uint8_t>(i * 7 + 50 * k);
    ga[2 * i] = static_cast<std::uint8_t>(i * 5), ga[2 * i + 1] = static_cast<std::uint8_t>(255 - i);
    for (int k = 0; k < 3; ++k) rgb16[6 * i + 2 * k] = static_cast<std::uint8_t>(i + 40 * k), rgb16[6 * i + 2 * k + 1] = 0xEE;
    g16[2 * i] = static_cast<std::uint8_t>(3 * i), g16[2 * i + 1] = 0x7F;
    indexed[i] = static_cast<std::uint8_t>(i % 4);
  }
  for (std::size_t y = 0; y < h; ++y)  // 1-bit grey: a checkerboard, packed 8 pixels a byte
    for (std::size_t x = 0; x < w; ++x)
      if ((x + y) % 2) bits[y * ((w + 7) / 8) + x / 8] |= static_cast<std::uint8_t>(0x80 >> (x % 8));
  const std::vector<std::uint8_t> palette = {10, 20, 30, 200, 100, 0, 0, 0, 255, 255, 255, 255};

  SECTION("RGBA: the alpha is dropped") {
    const auto out = decode_image(view(loom_test::encode_png(rgba, w, h, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8)), 3);
    for (std::size_t i = 0; i < n; ++i)
      for (int k = 0; k < 3; ++k) REQUIRE(out[3 * i + k] == rgba[4 * i + k]);
  }
  SECTION("grey + alpha: the alpha is dropped") {
    const auto out = decode_image(view(loom_test::encode_png(ga, w, h, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA, 8)), 1);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == ga[2 * i]);
  }
  SECTION("16-bit RGB and grey keep the high byte") {
    const auto out = decode_image(view(loom_test::encode_png(rgb16, w, h, SPNG_COLOR_TYPE_TRUECOLOR, 16)), 3);
    for (std::size_t i = 0; i < n; ++i)
      for (int k = 0; k < 3; ++k) REQUIRE(out[3 * i + k] == rgb16[6 * i + 2 * k]);
    const auto grey = decode_image(view(loom_test::encode_png(g16, w, h, SPNG_COLOR_TYPE_GRAYSCALE, 16)), 1);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(grey[i] == g16[2 * i]);
  }
  SECTION("a palette (with a transparency chunk) expands to its colours; to grey by luma") {
    const auto png = loom_test::encode_png(indexed, w, h, SPNG_COLOR_TYPE_INDEXED, 8, palette, {255, 0});
    const auto out = decode_image(view(png), 3);
    const auto grey = decode_image(view(png), 1);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t p = indexed[i];
      for (int k = 0; k < 3; ++k) REQUIRE(out[3 * i + k] == palette[3 * p + k]);
      REQUIRE(grey[i] == static_cast<std::uint8_t>((19595u * palette[3 * p] + 38470u * palette[3 * p + 1] +
                                                     7471u * palette[3 * p + 2] + 32768u) >> 16));
    }
  }
  SECTION("1-bit grey scales to 0 and 255") {
    const auto out = decode_image(view(loom_test::encode_png(bits, w, h, SPNG_COLOR_TYPE_GRAYSCALE, 1)), 1);
    for (std::size_t y = 0; y < h; ++y)
      for (std::size_t x = 0; x < w; ++x) REQUIRE(out[y * w + x] == ((x + y) % 2 ? 255 : 0));
  }
  SECTION("an interlaced PNG decodes to the same pixels") {
    const auto px = loom_test::photo_pixels(w, h, 3, 5);
    CHECK(decode_image(view(loom_test::encode_png(px, w, h, SPNG_COLOR_TYPE_TRUECOLOR, 8, {}, {}, true)), 3) == px);
  }
}

TEST_CASE("A JPEG decodes to exactly TurboJPEG's full decode: grey, RGB, 4:4:4, 4:2:2, 4:2:0, progressive", "[data][image][jpeg]") {
  struct variant {
    int channels, subsamp;
    bool progressive;
  };
  for (const variant v : {variant{3, TJSAMP_420, false}, variant{3, TJSAMP_422, false}, variant{3, TJSAMP_444, false},
                          variant{3, TJSAMP_420, true}, variant{1, TJSAMP_GRAY, false}}) {
    INFO("channels " << v.channels << ", subsampling " << v.subsamp << (v.progressive ? ", progressive" : ""));
    const bytes jpeg = loom_test::photo_jpeg(61, 45, 11, v.channels, 90, v.subsamp, v.progressive);
    const auto ref = loom_test::turbojpeg_decode(jpeg, v.channels);
    CHECK(decode_image(view(jpeg), v.channels) == ref);
    // Colour to grey is the JPEG's luma channel: what TurboJPEG's grey output gives.
    CHECK(decode_image(view(jpeg), 1) == loom_test::turbojpeg_decode(jpeg, 1));
  }
}

TEST_CASE("A window of a JPEG, full size or reduced 2, 4, 8 times, is exactly that part of TurboJPEG's decode", "[data][image][jpeg]") {
  const bytes jpeg = loom_test::photo_jpeg(301, 203, 12);
  image_scratch scratch;
  for (unsigned reduction : {1u, 2u, 4u, 8u}) {
    int rw = 0, rh = 0;
    const auto ref = loom_test::turbojpeg_decode(jpeg, 3, reduction, &rw, &rh);
    const auto refg = loom_test::turbojpeg_decode(jpeg, 1, reduction);
    const auto W = static_cast<std::size_t>(rw), H = static_cast<std::size_t>(rh);
    struct window {
      std::size_t x, y, w, h;
    };
    for (const window win : {window{0, 0, W, H}, window{W / 3, H / 4, W / 2, H / 3}, window{W - 5, H - 7, 5, 7},
                             window{7, 1, 1, H - 1}, window{W / 2 + 1, 0, W / 2 - 1, 2}}) {
      INFO("reduction " << reduction << ", window " << win.w << " x " << win.h << " at (" << win.x << ", " << win.y << ")");
      image_reader reader(scratch);
      reader.open(view(jpeg));
      const pixel_region r = reader.decode({3, reduction, win.x, win.y, win.w, win.h});
      CHECK(r.image_width == W);
      CHECK(r.image_height == H);
      CHECK(r.x0 <= win.x);
      CHECK(r.x0 + r.width >= win.x + win.w);
      CHECK(r.y0 == win.y);
      CHECK(r.height == win.h);
      CHECK(differences(r, win.x, win.y, win.w, win.h, ref, W, 3) == 0);
      reader.open(view(jpeg));
      const pixel_region g = reader.decode({1, reduction, win.x, win.y, win.w, win.h});
      CHECK(differences(g, win.x, win.y, win.w, win.h, refg, W, 1) == 0);
    }
  }
}

TEST_CASE("JPEG and PNG decode as Pillow decodes them (when Python has Pillow)", "[data][image][pillow]") {
  const char* python = std::getenv("LOOM_IMAGE_TEST_PYTHON");
  const std::string py = python && *python ? python : "/usr/bin/python3";
  if (std::system((py + " -c 'import PIL' >/dev/null 2>&1").c_str()) != 0) {
    WARN("skipped: " << py << " cannot import PIL (Debian: python3-pil; or set LOOM_IMAGE_TEST_PYTHON)");
    std::exit(77);
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("loom_image_pillow_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const bytes jpeg = loom_test::photo_jpeg(83, 67, 21);
  const bytes png = loom_test::png_of(loom_test::photo_pixels(83, 67, 3, 22), 83, 67, 3);
  for (const auto& [name, data] : {std::pair{"a.jpg", &jpeg}, std::pair{"a.png", &png}}) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(data->data()), static_cast<std::streamsize>(data->size()));
  }
  for (const auto& [name, mode] : {std::pair{"a.jpg", "RGB"}, std::pair{"a.jpg", "L"}, std::pair{"a.png", "RGB"}, std::pair{"a.png", "L"}}) {
    const fs::path out = dir / (std::string(name) + "." + mode + ".raw");
    const std::string cmd = py + " -c \"import sys; from PIL import Image; open(sys.argv[3], 'wb').write(Image.open(sys.argv[1]).convert(sys.argv[2]).tobytes())\" " +
                            (dir / name).string() + " " + mode + " " + out.string();
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream f(out, std::ios::binary);
    const std::vector<std::uint8_t> pil((std::istreambuf_iterator<char>(f)), {});
    const int c = std::string(mode) == "RGB" ? 3 : 1;
    const bytes& data = std::string(name) == "a.jpg" ? jpeg : png;
    const auto mine = decode_image(view(data), c);
    REQUIRE(pil.size() == mine.size());
    // Same libjpeg-turbo and same IDCT: exact, except grey from a colour JPEG, where Pillow
    // converts its RGB by luma and loom takes the JPEG's Y channel: within rounding.
    int worst = 0;
    for (std::size_t i = 0; i < pil.size(); ++i) worst = std::max(worst, std::abs(int(pil[i]) - int(mine[i])));
    INFO(name << " as " << mode);
    CHECK(worst <= (std::string(name) == "a.jpg" && c == 1 ? 2 : 0));
  }
  fs::remove_all(dir);
}

TEST_CASE("Bad images are bad_image exceptions that say what was expected and what was found", "[data][image][errors]") {
  image_scratch scratch;
  auto decode = [&](const bytes& b) {
    image_reader r(scratch);
    r.open(view(b));
    r.decode({});
  };
  const bytes jpeg = loom_test::photo_jpeg(64, 48, 3);
  const bytes png = loom_test::png_of(loom_test::photo_pixels(64, 48, 3, 4), 64, 48, 3);

  CHECK_THAT(error_message<bad_image>([&] { decode({}); }), Contains("empty image (0 bytes)") && Contains("expected a JPEG or PNG"));
  const bytes gif = {std::byte{'G'}, std::byte{'I'}, std::byte{'F'}, std::byte{'8'}, std::byte{'9'}, std::byte{'a'}};
  CHECK_THAT(error_message<bad_image>([&] { decode(gif); }),
             Contains("unknown image format") && Contains("expected a JPEG (starting FF D8 FF)") && Contains("found 6 bytes starting 47 49 46 38 39 61"));
  const bytes half_jpeg(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2));
  CHECK_THAT(error_message<bad_image>([&] { decode(half_jpeg); }), Contains("corrupt JPEG data (64 x 48 pixels"));
  const bytes header_only(jpeg.begin(), jpeg.begin() + 20);
  CHECK_THAT(error_message<bad_image>([&] { decode(header_only); }), Contains("corrupt JPEG header"));
  const bytes half_png(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(png.size() / 2));
  CHECK_THAT(error_message<bad_image>([&] { decode(half_png); }), Contains("corrupt PNG data (64 x 48 pixels"));
  bytes bad_crc = png;
  bad_crc[40] ^= std::byte{0x5a};  // inside the first IDAT chunk
  CHECK_THAT(error_message<bad_image>([&] { decode(bad_crc); }), Contains("corrupt PNG"));
  // A PNG header of zero width (with a valid checksum: libspng checks the header itself).
  {
    bytes zero = png;
    for (int i = 16; i < 20; ++i) zero[static_cast<std::size_t>(i)] = std::byte{0};  // IHDR width
    const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(zero.data() + 12), 17);
    for (int i = 0; i < 4; ++i) zero[static_cast<std::size_t>(29 + i)] = static_cast<std::byte>(crc >> (24 - 8 * i));
    CHECK_THAT(error_message<bad_image>([&] { decode(zero); }), Contains("corrupt PNG header") && Contains("width"));
  }
  // A header claiming more pixels than allowed: refused before anything is allocated.
  {
    image_reader r(scratch, 64 * 47);
    CHECK_THAT(error_message<bad_image>([&] { r.open(view(jpeg)); }),
               Contains("JPEG image of 64 x 48 pixels: expected at most 3008 pixels"));
    CHECK_THAT(error_message<bad_image>([&] { r.open(view(png)); }), Contains("PNG image of 64 x 48 pixels: expected at most 3008"));
  }
  // A CMYK JPEG (TurboJPEG writes it as YCCK).
  {
    tjhandle t = tjInitCompress();
    std::vector<std::uint8_t> cmyk(16 * 16 * 4, 100);
    unsigned char* out = nullptr;
    unsigned long size = 0;
    REQUIRE(tjCompress2(t, cmyk.data(), 16, 0, 16, TJPF_CMYK, &out, &size, TJSAMP_444, 90, 0) == 0);
    const bytes b(reinterpret_cast<std::byte*>(out), reinterpret_cast<std::byte*>(out) + size);
    tjFree(out);
    tjDestroy(t);
    CHECK_THAT(error_message<bad_image>([&] { decode(b); }), Contains("unsupported JPEG colour space") && Contains("expected grey, YCbCr or RGB"));
  }
  // The reader is usable after every failure.
  image_reader r(scratch);
  r.open(view(jpeg));
  CHECK(r.decode({}).width == 64);
}
