// SPDX-License-Identifier: Apache-2.0
// Fuzzing the decoders: about 1,000 damaged copies (bytes changed, cut short, or both) of JPEGs
// (baseline, progressive, grey, 4:4:4) and PNGs (RGB, grey, palette, 16-bit, interlaced), each
// through the plain full decode and through an augmenting pipeline. Every case either decodes
// (to finite floats) or is a bad_image; nothing crashes, aborts, exits or prints.

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "image_files.hpp"
#include "loom/data/image_pipeline.hpp"

using namespace loom::data;
using loom_test::bytes;
using loom_test::view;

namespace {

// Sends this process's stderr to a file while it lives; text() is what was written.
class stderr_capture {
 public:
  stderr_capture() : path_(std::filesystem::temp_directory_path() / ("loom_fuzz_stderr_" + std::to_string(::getpid()))) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;
  ~stderr_capture() { restore(); }
  std::string text() {
    restore();
    std::ifstream f(path_);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    std::filesystem::remove(path_);
    return s;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::filesystem::path path_;
  int saved_ = -1;
};

}  // namespace

TEST_CASE("Damaged JPEGs and PNGs decode or are bad_image: never a crash, an abort or a message", "[data][image][fuzz]") {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<const char*, bytes>> files = {
      {"baseline JPEG 4:2:0", loom_test::photo_jpeg(96, 80, 1)},
      {"progressive JPEG", loom_test::photo_jpeg(72, 64, 2, 3, 85, TJSAMP_420, true)},
      {"grey JPEG", loom_test::photo_jpeg(50, 70, 3, 1)},
      {"JPEG 4:4:4", loom_test::photo_jpeg(40, 40, 4, 3, 95, TJSAMP_444)},
      {"RGB PNG", loom_test::png_of(loom_test::photo_pixels(48, 40, 3, 5), 48, 40, 3)},
      {"grey PNG", loom_test::png_of(loom_test::photo_pixels(28, 28, 1, 6), 28, 28, 1)},
  };
  {
    std::vector<std::uint8_t> idx(30 * 20), rgb16(30 * 20 * 6);
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::uint8_t>(i % 3);
    for (std::size_t i = 0; i < rgb16.size(); ++i) rgb16[i] = static_cast<std::uint8_t>(i * 31);
    files.push_back({"palette PNG", loom_test::encode_png(idx, 30, 20, SPNG_COLOR_TYPE_INDEXED, 8, {1, 2, 3, 90, 80, 70, 200, 10, 0})});
    files.push_back({"16-bit PNG", loom_test::encode_png(rgb16, 30, 20, SPNG_COLOR_TYPE_TRUECOLOR, 16)});
    files.push_back({"interlaced PNG", loom_test::encode_png(loom_test::photo_pixels(33, 21, 3, 7), 33, 21, SPNG_COLOR_TYPE_TRUECOLOR, 8,
                                                             {}, {}, true)});
  }
  // A pixel limit keeps a damaged header's claims small.
  const image_pipeline<rgb, random_resized_crop<32>, flip, imagenet_normalize> augment(std::size_t{1} << 22);
  const image_pipeline<gray, resize<24>, center_crop<20>> grey(std::size_t{1} << 22);
  std::vector<float> out(3 * 32 * 32), out_grey(20 * 20);

  loom::splitmix64 rng(2024);
  std::size_t decoded = 0, bad = 0, other = 0;
  std::string first_other;
  const std::size_t cases = 1000;
  {
    stderr_capture quiet;
    image_scratch scratch;
    for (std::size_t n = 0; n < cases; ++n) {
      const auto& [name, original] = files[n % files.size()];
      bytes b = original;
      const std::uint64_t how = rng.below(3);
      if (how != 1) {  // change 1 to 8 bytes (past the first 2: the format must still be recognised half the time)
        const std::uint64_t k = 1 + rng.below(8);
        for (std::uint64_t i = 0; i < k; ++i) b[2 + rng.below(b.size() - 2)] = static_cast<std::byte>(rng.below(256));
      }
      if (how != 0) b.resize(rng.below(b.size()));  // cut short (possibly to nothing)
      for (int path = 0; path < 3; ++path) {
        try {
          if (path == 0) {
            image_reader r(scratch, std::size_t{1} << 22);
            r.open(view(b));
            r.decode({});
          } else if (path == 1) {
            augment(view(b), {1, 0, n}, out.data(), scratch);
            for (float v : out)
              if (!std::isfinite(v)) throw std::runtime_error("a non-finite output");
          } else {
            grey(view(b), {1, 0, n}, out_grey.data(), scratch);
          }
          ++decoded;
        } catch (const bad_image&) {
          ++bad;
        } catch (const std::exception& e) {
          if (!other++) first_other = std::string(name) + ": " + e.what();
        }
      }
    }
    const std::string printed = quiet.text();
    CHECK(printed.empty());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(cases << " cases x 3 paths: " << decoded << " decoded, " << bad << " bad_image, in " << seconds << " s");
  CHECK(other == 0);
  CHECK(first_other == "");
  CHECK(decoded + bad == 3 * cases);
  CHECK(bad > cases / 2);   // most damage is caught
  CHECK(decoded > cases / 10);  // and some survives it
  WARN(cases << " fuzz cases x 3 paths: " << decoded << " decoded, " << bad << " bad_image, " << seconds << " s");
}
