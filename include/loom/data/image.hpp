// SPDX-License-Identifier: Apache-2.0
#pragma once
// Decoding JPEG (libjpeg-turbo's libjpeg API) and PNG (libspng) files held in memory to 8-bit
// grey or RGB pixels, of the whole image or of only the window a crop needs, at full size or
// reduced 2, 4 or 8 times in the JPEG's DCT domain. Every failure is a loom::data::bad_image
// whose message says what was expected and what was found; nothing is printed and nothing
// aborts. Not the augmentation (image_pipeline.hpp) nor the threads (decode_pool.hpp).
//
// The component loom::images (CMake) brings the libraries: Debian's libjpeg62-turbo-dev and
// libspng-dev. Its functions are inline in every translation unit that includes this header
// (impl/image.ipp): they are not part of loom::compiled, which would need both libraries in every
// program.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/sample_key.hpp"  // sample_key, bad_image

namespace loom::data {

/// The file formats the decoders read.
enum class image_format { jpeg, png };

/// "JPEG" or "PNG".
inline const char* to_string(image_format f) noexcept { return f == image_format::jpeg ? "JPEG" : "PNG"; }

/// What an image's header says.
struct image_header {
  image_format format = image_format::jpeg;
  std::size_t width = 0, height = 0;
  /// Channels as stored: 1 grey, 2 grey + alpha, 3 colour, 4 colour + alpha (PNG) or CMYK
  /// (JPEG); a PNG palette counts as 3 (4 with a transparency chunk is still 3: alpha is dropped).
  int channels = 0;
  /// Bits per channel as stored: 8 for JPEG; 1, 2, 4, 8 or 16 for PNG.
  int bit_depth = 8;
};

/// The most pixels (width x height) an image may have, unless the caller sets another limit:
/// 2^26, 67 million, about PIL's "decompression bomb" threshold. A header claiming more is a
/// bad_image before anything is allocated.
inline constexpr std::size_t default_max_image_pixels = std::size_t{1} << 26;

/// A window of a decoded image: `height` rows of `width` pixels, row r at data + r * stride,
/// with `bytes_per_pixel` bytes per pixel: 1 (grey) or 4 (red, green, blue, a fourth byte that
/// means nothing). (x0, y0) is the window's top-left pixel in the decoded image, which is
/// image_width x image_height: the file's size divided by `reduction` (1, 2, 4 or 8), rounded up.
/// Valid until the scratch it was decoded into is used again.
struct pixel_region {
  const std::uint8_t* data = nullptr;
  std::size_t stride = 0;
  std::size_t x0 = 0, y0 = 0, width = 0, height = 0;
  std::size_t image_width = 0, image_height = 0;
  unsigned reduction = 1;
  int bytes_per_pixel = 1;
  /// Pixel (x, y) of the decoded image, channel c (x0 <= x < x0 + width, y0 <= y < y0 + height).
  std::uint8_t at(std::size_t x, std::size_t y, int c = 0) const noexcept {
    return data[(y - y0) * stride + (x - x0) * static_cast<std::size_t>(bytes_per_pixel) + static_cast<std::size_t>(c)];
  }
};

/// What to decode: `channels` (1 grey, 3 RGB) of the window [x, x + width) x [y, y + height)
/// of the image reduced `reduction` times (1, 2, 4 or 8; JPEG only, PNG needs 1), in the
/// reduced image's coordinates. width or height 0: the whole (reduced) image.
struct region_request {
  int channels = 3;
  unsigned reduction = 1;
  std::size_t x = 0, y = 0, width = 0, height = 0;
};

namespace detail {
struct jpeg_state;  // libjpeg's decompressor and its error handler, reused image after image
struct jpeg_state_deleter {
  void operator()(jpeg_state* s) const noexcept;
};
}  // namespace detail

/// Memory one decoding thread reuses from image to image: the pixels of the last decoded
/// window, the resampler's buffers, libjpeg's decompressor. Grows to the largest image seen;
/// bytes() says how much it holds. Not shared between threads.
class image_scratch {
 public:
  image_scratch() = default;
  image_scratch(const image_scratch&) = delete;
  image_scratch& operator=(const image_scratch&) = delete;
  ~image_scratch();

  /// Bytes held by the buffers (their capacity), libjpeg's decompressor included.
  std::size_t bytes() const noexcept;
  /// Gives the buffers back to the allocator (e.g. after an unusually large image).
  void release() noexcept;

  // The buffers, for the decoders and the resampler.
  std::vector<std::uint8_t> pixels;
  std::vector<float> floats;
  std::vector<float> taps;
  std::vector<std::int32_t> ints;
  std::unique_ptr<detail::jpeg_state, detail::jpeg_state_deleter> jpeg;
};

/// The scratch of the calling thread (thread_local), for callers that give none.
inline image_scratch& this_thread_image_scratch();

/// Reads one image at a time from memory: open() parses the header, decode() the pixels.
/// Reuses `scratch`; the bytes given to open() must stay alive until decode() returns.
class image_reader {
 public:
  explicit image_reader(image_scratch& scratch, std::size_t max_pixels = default_max_image_pixels) noexcept
      : scratch_(&scratch), max_pixels_(max_pixels) {}
  image_reader(const image_reader&) = delete;
  image_reader& operator=(const image_reader&) = delete;
  ~image_reader();

  /// Parses the header of the JPEG or PNG file in `encoded` (told apart by their first bytes).
  ///
  /// Throws: bad_image when the bytes are neither, the header is corrupt or truncated, the
  /// size is zero or above max_pixels, or a JPEG's colour space is CMYK or YCCK.
  const image_header& open(std::span<const std::byte> encoded);

  /// Decodes the window `r` asks for (after open()). The region returned covers it and may
  /// be wider (a JPEG's columns: an iMCU more on each side, from a block boundary, so that the
  /// window's pixels are exactly those of a full decode); grey from colour is the luma
  /// (JPEG: its Y channel; PNG: (19595 R + 38470 G + 7471 B + 32768) >> 16, as PIL's
  /// convert("L")); RGB from grey repeats the grey; alpha is dropped; 16-bit PNG channels
  /// keep their high byte, as libspng's 8-bit output gives them. A JPEG is decoded only as far
  /// as the window's last row: damage below it goes unnoticed.
  ///
  /// Throws: bad_image when the data is corrupt or truncated (a libjpeg warning counts);
  /// loom::invalid_argument without open() first, for channels other than 1 or 3, a reduction
  /// other than 1, 2, 4, 8 (or of a PNG), or a window outside the (reduced) image.
  pixel_region decode(const region_request& r);

  /// The header open() read.
  const image_header& header() const noexcept { return header_; }

 private:
  void close_png() noexcept;

  image_scratch* scratch_;
  std::size_t max_pixels_;
  image_header header_{};
  std::span<const std::byte> encoded_{};
  void* png_ = nullptr;  // spng_ctx*, between open() and decode() of a PNG
  bool open_ = false;
};

/// Decodes the whole of `encoded` to `channels` (1 or 3) channels: height rows of width
/// pixels, channels bytes each, interleaved, row by row (a plain full decode, for tests and
/// tools). Throws: as image_reader::open and decode.
inline std::vector<std::uint8_t> decode_image(std::span<const std::byte> encoded, int channels,
                                              image_header* header = nullptr);

}  // namespace loom::data

#include "loom/data/impl/image.ipp"
