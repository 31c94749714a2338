// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the image tests share: synthetic photo-like pixels, JPEG files encoded with TurboJPEG,
// PNG files of every colour type and bit depth encoded with libspng, and TurboJPEG's plain full
// decode as the reference of the JPEG reader. Every file is made in memory from a seed.

#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/core/random.hpp"

namespace loom_test {

using bytes = std::vector<std::byte>;

inline std::span<const std::byte> view(const bytes& b) { return {b.data(), b.size()}; }

/// w x h pixels of c interleaved 8-bit channels that look a little like a photo: smooth
/// gradients, a few discs with edges, and noise, all from `seed`.
inline std::vector<std::uint8_t> photo_pixels(std::size_t w, std::size_t h, int c, std::uint64_t seed) {
  std::vector<std::uint8_t> px(w * h * static_cast<std::size_t>(c));
  loom::splitmix64 rng(seed);
  double cx[3], cy[3], r[3];
  for (int k = 0; k < 3; ++k) {
    cx[k] = static_cast<double>(rng.below(w));
    cy[k] = static_cast<double>(rng.below(h));
    r[k] = 3.0 + static_cast<double>(rng.below(std::max<std::size_t>(w, h) / 3 + 1));
  }
  for (std::size_t y = 0; y < h; ++y)
    for (std::size_t x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) {
        double v = 128 + 90 * std::sin(0.037 * static_cast<double>(x) * (k + 1) + 0.021 * static_cast<double>(y) + static_cast<double>(seed % 7));
        for (int d = 0; d < 3; ++d) {
          const double dx = static_cast<double>(x) - cx[d], dy = static_cast<double>(y) - cy[d];
          if (dx * dx + dy * dy < r[d] * r[d]) v = 255 - v * 0.5 - 20 * d;
        }
        v += static_cast<double>(rng.below(17)) - 8;
        px[(y * w + x) * static_cast<std::size_t>(c) + static_cast<std::size_t>(k)] =
            static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return px;
}

/// A JPEG of w x h pixels (c = 1 grey, 3 RGB) at `quality`, chroma subsampling `subsamp`
/// (TurboJPEG's TJSAMP_*), optionally progressive.
inline bytes encode_jpeg(const std::vector<std::uint8_t>& px, std::size_t w, std::size_t h, int c, int quality = 90,
                         int subsamp = TJSAMP_420, bool progressive = false) {
  tjhandle t = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  const int rc = tjCompress2(t, px.data(), static_cast<int>(w), 0, static_cast<int>(h), c == 1 ? TJPF_GRAY : TJPF_RGB, &out,
                             &size, c == 1 ? TJSAMP_GRAY : subsamp, quality, flags);
  if (rc != 0) {
    const std::string m = tjGetErrorStr2(t);
    tjDestroy(t);
    throw std::runtime_error("tjCompress2: " + m);
  }
  bytes b(reinterpret_cast<const std::byte*>(out), reinterpret_cast<const std::byte*>(out) + size);
  tjFree(out);
  tjDestroy(t);
  return b;
}

/// A photo-like JPEG from `seed`.
inline bytes photo_jpeg(std::size_t w, std::size_t h, std::uint64_t seed, int c = 3, int quality = 90,
                        int subsamp = TJSAMP_420, bool progressive = false) {
  return encode_jpeg(photo_pixels(w, h, c, seed), w, h, c, quality, subsamp, progressive);
}

/// TurboJPEG's decode of the whole JPEG at 1/reduction of its size, to RGB (c = 3) or grey.
inline std::vector<std::uint8_t> turbojpeg_decode(const bytes& jpeg, int c, unsigned reduction = 1, int* width = nullptr,
                                                  int* height = nullptr) {
  tjhandle t = tjInitDecompress();
  int w = 0, h = 0, ss = 0, cs = 0;
  auto* src = reinterpret_cast<unsigned char*>(const_cast<std::byte*>(jpeg.data()));
  if (tjDecompressHeader3(t, src, jpeg.size(), &w, &h, &ss, &cs) != 0) {
    tjDestroy(t);
    throw std::runtime_error("tjDecompressHeader3 failed");
  }
  const int sw = (w + static_cast<int>(reduction) - 1) / static_cast<int>(reduction);
  const int sh = (h + static_cast<int>(reduction) - 1) / static_cast<int>(reduction);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(sw * sh * c));
  if (tjDecompress2(t, src, jpeg.size(), out.data(), sw, 0, sh, c == 1 ? TJPF_GRAY : TJPF_RGB, 0) != 0) {
    const std::string m = tjGetErrorStr2(t);
    tjDestroy(t);
    throw std::runtime_error("tjDecompress2: " + m);
  }
  tjDestroy(t);
  if (width) *width = sw;
  if (height) *height = sh;
  return out;
}

/// A PNG of w x h pixels as stored: `samples` holds the PNG's own samples row by row (8-bit:
/// one byte each; 16-bit: two bytes each, most significant first; below 8 bits: packed, as
/// PNG packs them), colour type and bit depth as the PNG specification names them. For an
/// indexed PNG, `palette` holds RGB triples and `alpha` (if not empty) a tRNS chunk.
inline bytes encode_png(const std::vector<std::uint8_t>& samples, std::uint32_t w, std::uint32_t h, int color_type,
                        int bit_depth, const std::vector<std::uint8_t>& palette = {},
                        const std::vector<std::uint8_t>& alpha = {}, bool interlaced = false) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{w, h, static_cast<std::uint8_t>(bit_depth), static_cast<std::uint8_t>(color_type), 0, 0,
                 static_cast<std::uint8_t>(interlaced ? 1 : 0)};
  int e = spng_set_ihdr(ctx, &ihdr);
  if (!e && !palette.empty()) {
    spng_plte plte{};
    plte.n_entries = static_cast<std::uint32_t>(palette.size() / 3);
    for (std::uint32_t i = 0; i < plte.n_entries; ++i)
      plte.entries[i] = {palette[3 * i], palette[3 * i + 1], palette[3 * i + 2], 0};
    e = spng_set_plte(ctx, &plte);
  }
  if (!e && !alpha.empty()) {
    spng_trns trns{};
    trns.n_type3_entries = static_cast<std::uint32_t>(alpha.size());
    for (std::size_t i = 0; i < alpha.size(); ++i) trns.type3_alpha[i] = alpha[i];
    e = spng_set_trns(ctx, &trns);
  }
  // libspng reads 16-bit samples in host order for SPNG_FMT_PNG: swap the big-endian ones.
  std::vector<std::uint8_t> data = samples;
  if (bit_depth == 16)
    for (std::size_t i = 0; i + 1 < data.size(); i += 2) std::swap(data[i], data[i + 1]);
  if (!e) e = spng_encode_image(ctx, data.data(), data.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  std::size_t size = 0;
  void* png = e ? nullptr : spng_get_png_buffer(ctx, &size, &e);
  spng_ctx_free(ctx);
  if (e || !png) throw std::runtime_error(std::string("libspng encode: ") + spng_strerror(e));
  bytes b(static_cast<const std::byte*>(png), static_cast<const std::byte*>(png) + size);
  std::free(png);
  return b;
}

/// An 8-bit grey (c = 1) or RGB (c = 3) PNG of `px`.
inline bytes png_of(const std::vector<std::uint8_t>& px, std::size_t w, std::size_t h, int c) {
  return encode_png(px, static_cast<std::uint32_t>(w), static_cast<std::uint32_t>(h),
                    c == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR, 8);
}

}  // namespace loom_test
