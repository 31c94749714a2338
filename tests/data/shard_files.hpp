// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the shard tests: grey PNGs through libspng, tar shards written member by member,
// sets of shards whose every sample tells its own index (its pixels) and label, and a small
// pipeline that decodes them (grey PNG -> floats / 255), independent of loom's image pipeline.

#include <spng.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/shape.hpp"
#include "loom/data/sample_key.hpp"
#include "loom/data/shards.hpp"
#include "loom/data/tar.hpp"

namespace loom_test {

using bytes = std::vector<std::byte>;

inline bytes to_bytes(const std::string& s) {
  bytes b(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) b[i] = static_cast<std::byte>(s[i]);
  return b;
}

inline bytes file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes b(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) b[i] = static_cast<std::byte>(c[i]);
  return b;
}

inline void write_file(const std::filesystem::path& p, const bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

/// A grey 8-bit PNG of w x h pixels.
inline bytes png_gray(std::size_t w, std::size_t h, const std::vector<std::uint8_t>& px) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<std::uint32_t>(w);
  ihdr.height = static_cast<std::uint32_t>(h);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_GRAYSCALE;
  spng_set_ihdr(ctx, &ihdr);
  int err = spng_encode_image(ctx, px.data(), px.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  std::size_t size = 0;
  void* png = err ? nullptr : spng_get_png_buffer(ctx, &size, &err);
  spng_ctx_free(ctx);
  if (!png) throw std::runtime_error(std::string("spng cannot encode: ") + spng_strerror(err));
  bytes out(size);
  std::memcpy(out.data(), png, size);
  std::free(png);
  return out;
}

/// The pixels of the test image of sample `index`: pixel 0 and 1 are the index's low and high
/// byte, pixel 2 their complement sum (a check), the rest a pattern.
inline std::vector<std::uint8_t> index_pixels(std::size_t w, std::size_t h, std::uint64_t index) {
  std::vector<std::uint8_t> px(w * h);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>((index * 31 + i * 7) & 0xFF);
  px[0] = static_cast<std::uint8_t>(index & 0xFF);
  px[1] = static_cast<std::uint8_t>((index >> 8) & 0xFF);
  px[2] = static_cast<std::uint8_t>(0xFF - ((px[0] + px[1]) & 0xFF));
  return px;
}

/// The label the test sets give sample `index`.
inline std::int32_t test_label(std::uint64_t index, std::size_t classes = 10) {
  return static_cast<std::int32_t>((index * 7 + 3) % classes);
}

/// Decodes a grey PNG of exactly H x W pixels into floats / 255 with libspng. Throws
/// loom::data::bad_image when it cannot.
template <std::size_t H, std::size_t W>
struct gray_png {
  using output_shape = loom::shape<1, H, W>;
  void operator()(std::span<const std::byte> encoded, const loom::data::sample_key&, float* out) const {
    spng_ctx* ctx = spng_ctx_new(0);
    std::vector<std::uint8_t> px(H * W);
    spng_set_png_buffer(ctx, encoded.data(), encoded.size());
    spng_ihdr ihdr{};
    int err = spng_get_ihdr(ctx, &ihdr);
    if (!err && (ihdr.width != W || ihdr.height != H || ihdr.color_type != SPNG_COLOR_TYPE_GRAYSCALE ||
                 ihdr.bit_depth != 8)) {
      spng_ctx_free(ctx);
      throw loom::data::bad_image("PNG of " + std::to_string(ihdr.width) + " x " + std::to_string(ihdr.height) +
                                  ": expected an 8-bit grey image of " + std::to_string(W) + " x " + std::to_string(H));
    }
    if (!err) err = spng_decode_image(ctx, px.data(), px.size(), SPNG_FMT_G8, 0);
    spng_ctx_free(ctx);
    if (err) throw loom::data::bad_image(std::string("PNG does not decode: ") + spng_strerror(err));
    for (std::size_t i = 0; i < px.size(); ++i) out[i] = static_cast<float>(px[i]) / 255.0f;
  }
};

/// The index a test image decoded by gray_png says it is, or -1 when its check pixel disagrees.
inline std::int64_t decoded_index(const float* x) {
  const auto b = [&](int i) { return static_cast<unsigned>(x[i] * 255.0f + 0.5f); };
  if (((b(0) + b(1)) & 0xFF) != 0xFF - b(2)) return -1;
  return static_cast<std::int64_t>(b(0) | (b(1) << 8));
}

/// Writes one shard of samples [first, first + n): KEY.png (index_pixels) and KEY.cls for each,
/// KEY.json for every fifth; keys are the zero-padded index. Returns the file.
inline std::filesystem::path write_index_shard(const std::filesystem::path& file, std::uint64_t first, std::uint64_t n,
                                               std::size_t side = 8, std::size_t classes = 10) {
  loom::data::tar_writer w(file);
  for (std::uint64_t i = first; i < first + n; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "%06llu", static_cast<unsigned long long>(i));
    w.add(std::string(key) + ".png", png_gray(side, side, index_pixels(side, side, i)));
    w.add(std::string(key) + ".cls", to_bytes(std::to_string(test_label(i, classes))));
    if (i % 5 == 0) w.add(std::string(key) + ".json", to_bytes("{\"index\": " + std::to_string(i) + "}"));
  }
  w.close();
  return file;
}

/// Writes shards PREFIX-000000.tar, ... of the given sample counts into dir (sample indices run
/// on from shard to shard) and, when `manifest`, PREFIX.shards.json beside them.
inline std::vector<std::filesystem::path> write_index_shards(const std::filesystem::path& dir, const std::string& prefix,
                                                             const std::vector<std::uint64_t>& counts,
                                                             bool manifest = true, std::size_t side = 8,
                                                             std::size_t classes = 10) {
  std::vector<std::filesystem::path> out;
  loom::data::shard_manifest m;
  m.classes = classes;
  std::uint64_t first = 0;
  for (std::size_t s = 0; s < counts.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "%s-%06zu.tar", prefix.c_str(), s);
    out.push_back(write_index_shard(dir / name, first, counts[s], side, classes));
    m.shards.push_back({out.back(), std::filesystem::file_size(out.back()), counts[s]});
    first += counts[s];
  }
  if (manifest) loom::data::write_manifest(dir / (prefix + ".shards.json"), m);
  return out;
}

/// Runs f() with this process's stderr going to a file, and returns what was written to it.
template <class F>
std::string capture_stderr(F&& f) {
  std::fflush(stderr);
  char name[] = "/tmp/loom-test-stderr-XXXXXX";
  const int fd = ::mkstemp(name);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    ::close(fd);
    ::unlink(name);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(name);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(name);
  return text;
}

}  // namespace loom_test
