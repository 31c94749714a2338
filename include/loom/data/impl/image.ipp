// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of image.hpp: the JPEG reader on libjpeg-turbo's libjpeg API (errors and
// warnings caught with setjmp/longjmp, never printed, never exit()), the PNG reader on
// libspng. Included at the end of image.hpp; always inline (see there why).

#include <spng.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>
#include <string>
#include <utility>

#include <jpeglib.h>

#include "loom/data/image.hpp"

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "loom/data/image.hpp needs libjpeg-turbo 1.5 or later (jpeg_crop_scanline, jpeg_skip_scanlines): Debian package libjpeg62-turbo-dev"
#endif

namespace loom::data {
namespace detail {

/// libjpeg's decompressor, created once per scratch and reused image after image, and an
/// error manager that jumps back (longjmp) instead of calling exit() or printing.
struct jpeg_state {
  struct error_manager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  };
  jpeg_decompress_struct cinfo;
  error_manager err;
  bool created = false;
};

/// libjpeg's error exit: keeps the message and jumps back to the guarded call.
inline void jpeg_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<jpeg_state::error_manager*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

/// libjpeg's messages: a warning (level < 0: corrupt or truncated data that libjpeg would
/// patch over with grey) is an error here; trace messages are dropped. Nothing is printed.
inline void jpeg_emit_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_error_exit(c);
}

inline void jpeg_output_message(j_common_ptr) {}

/// Each guarded call arms the jump and then calls libjpeg; no C++ object with a destructor
/// lives in these frames, so the longjmp skips none. false: libjpeg failed, the decompressor
/// is reset (reusable) and the message is in s.err.message.
inline bool jpeg_create_guarded(jpeg_state& s, std::size_t max_memory) {
  s.cinfo.err = jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = jpeg_error_exit;
  s.err.pub.emit_message = jpeg_emit_message;
  s.err.pub.output_message = jpeg_output_message;
  s.err.message[0] = '\0';
  if (setjmp(s.err.jump)) return false;
  jpeg_create_decompress(&s.cinfo);
  // Bounds libjpeg's whole-image buffers (a progressive JPEG's coefficients): past it, libjpeg
  // stops with an error instead of allocating what a corrupt header claims.
  s.cinfo.mem->max_memory_to_use = static_cast<long>(max_memory);
  return true;
}

inline bool jpeg_read_header_guarded(jpeg_state& s, const unsigned char* data, unsigned long size) {
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&s.cinfo);
    return false;
  }
  jpeg_mem_src(&s.cinfo, data, size);
  jpeg_read_header(&s.cinfo, TRUE);
  return true;
}

struct jpeg_decode_args {
  J_COLOR_SPACE out_space = JCS_EXT_RGBX;
  unsigned reduction = 1;
  JDIMENSION x = 0, width = 0, y = 0, height = 0;  // in: the window; out: x and width as cropped
  unsigned char* buffer = nullptr;
  std::size_t stride = 0;
  JDIMENSION output_width = 0, output_height = 0;  // out: the reduced image's size
};

/// The reduced image's size for a.reduction, without decoding.
inline bool jpeg_output_size_guarded(jpeg_state& s, jpeg_decode_args& a) {
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&s.cinfo);
    return false;
  }
  s.cinfo.scale_num = 1;
  s.cinfo.scale_denom = a.reduction;
  jpeg_calc_output_dimensions(&s.cinfo);
  a.output_width = s.cinfo.output_width;
  a.output_height = s.cinfo.output_height;
  return true;
}

/// Decodes rows [y, y + height) of columns [x, x + width) (x and width widened by an iMCU on
/// each side and to the block grid) into a.buffer, then stops: the rows below are never decoded.
inline bool jpeg_decode_guarded(jpeg_state& s, jpeg_decode_args& a) {
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&s.cinfo);
    return false;
  }
  j_decompress_ptr c = &s.cinfo;
  c->out_color_space = a.out_space;
  c->scale_num = 1;
  c->scale_denom = a.reduction;
  jpeg_start_decompress(c);
  // Subsampled chroma is upsampled from its neighbours: a column at the edge of a crop would
  // lack one and differ from the full decode, so the crop reaches one iMCU beyond the window
  // on each side (jpeg_crop_scanline then aligns its left edge to the block grid).
  const JDIMENSION margin =
      c->max_h_samp_factor > 1 ? static_cast<JDIMENSION>(c->min_DCT_scaled_size * c->max_h_samp_factor) : 0;
  const JDIMENSION right = std::min<JDIMENSION>(a.x + a.width + margin, c->output_width);
  a.x = a.x > margin ? a.x - margin : 0;
  a.width = right - a.x;
  if (a.x != 0 || a.width != c->output_width) jpeg_crop_scanline(c, &a.x, &a.width);
  if (a.y > 0) jpeg_skip_scanlines(c, a.y);
  constexpr JDIMENSION batch = 16;
  JSAMPROW rows[batch];
  const JDIMENSION end = a.y + a.height;
  while (c->output_scanline < end) {
    const JDIMENSION first = c->output_scanline;
    const JDIMENSION n = std::min(batch, end - first);
    for (JDIMENSION i = 0; i < n; ++i) rows[i] = a.buffer + static_cast<std::size_t>(first - a.y + i) * a.stride;
    if (jpeg_read_scanlines(c, rows, n) == 0) break;  // suspension: cannot happen with a memory source
  }
  jpeg_abort_decompress(c);
  return true;
}

inline std::string jpeg_message(const jpeg_state& s) {
  return s.err.message[0] ? std::string(s.err.message) : std::string("unknown libjpeg error");
}

inline void spng_free_ctx(void* p) noexcept {
  if (p) spng_ctx_free(static_cast<spng_ctx*>(p));
}

/// "FF D8 FF E0" — the first bytes of `encoded`, for messages about unknown formats.
inline std::string first_bytes(std::span<const std::byte> encoded) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string s;
  for (std::size_t i = 0; i < std::min<std::size_t>(encoded.size(), 8); ++i) {
    const auto b = static_cast<unsigned>(encoded[i]);
    if (i) s += ' ';
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

inline std::string size_text(std::size_t w, std::size_t h) { return std::to_string(w) + " x " + std::to_string(h); }

/// PIL's luma ("L" from "RGB"): (19595 R + 38470 G + 7471 B + 32768) >> 16.
inline std::uint8_t luma(std::uint8_t r, std::uint8_t g, std::uint8_t b) noexcept {
  return static_cast<std::uint8_t>((19595u * r + 38470u * g + 7471u * b + 32768u) >> 16);
}

}  // namespace detail

inline void detail::jpeg_state_deleter::operator()(jpeg_state* s) const noexcept {
  if (s && s->created) jpeg_destroy_decompress(&s->cinfo);
  delete s;
}

inline image_scratch::~image_scratch() = default;

inline std::size_t image_scratch::bytes() const noexcept {
  return pixels.capacity() + (floats.capacity() + taps.capacity()) * sizeof(float) + ints.capacity() * sizeof(std::int32_t) +
         (jpeg ? sizeof(detail::jpeg_state) : 0);
}

inline void image_scratch::release() noexcept {
  std::vector<std::uint8_t>().swap(pixels);
  std::vector<float>().swap(floats);
  std::vector<float>().swap(taps);
  std::vector<std::int32_t>().swap(ints);
}

inline image_scratch& this_thread_image_scratch() {
  thread_local image_scratch scratch;
  return scratch;
}

inline image_reader::~image_reader() { close_png(); }

inline void image_reader::close_png() noexcept {
  detail::spng_free_ctx(png_);
  png_ = nullptr;
}

inline const image_header& image_reader::open(std::span<const std::byte> encoded) {
  close_png();
  open_ = false;
  encoded_ = encoded;
  header_ = {};
  const auto* bytes = reinterpret_cast<const unsigned char*>(encoded.data());
  const std::size_t n = encoded.size();
  static constexpr unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    if (!scratch_->jpeg) {
      scratch_->jpeg.reset(new detail::jpeg_state);
      // Whole-image buffers of up to 6 bytes per pixel of the largest image allowed.
      if (!detail::jpeg_create_guarded(*scratch_->jpeg, std::max<std::size_t>(max_pixels_ * 6, std::size_t{64} << 20))) {
        const std::string m = detail::jpeg_message(*scratch_->jpeg);
        scratch_->jpeg.reset();
        throw bad_image("loom: cannot create libjpeg's decompressor: " + m);
      }
      scratch_->jpeg->created = true;
    }
    detail::jpeg_state& s = *scratch_->jpeg;
    jpeg_abort_decompress(&s.cinfo);  // a previous image opened but not decoded: back to the start state
    if (!detail::jpeg_read_header_guarded(s, bytes, static_cast<unsigned long>(n)))
      throw bad_image("loom: corrupt JPEG header (" + std::to_string(n) + " bytes): " + detail::jpeg_message(s));
    header_.format = image_format::jpeg;
    header_.width = s.cinfo.image_width;
    header_.height = s.cinfo.image_height;
    header_.channels = s.cinfo.num_components;
    header_.bit_depth = 8;
    if (s.cinfo.jpeg_color_space == JCS_CMYK || s.cinfo.jpeg_color_space == JCS_YCCK) {
      jpeg_abort_decompress(&s.cinfo);
      throw bad_image("loom: unsupported JPEG colour space " +
                      std::string(s.cinfo.jpeg_color_space == JCS_CMYK ? "CMYK" : "YCCK") +
                      ": expected grey, YCbCr or RGB");
    }
    if (s.cinfo.jpeg_color_space != JCS_GRAYSCALE && s.cinfo.jpeg_color_space != JCS_YCbCr &&
        s.cinfo.jpeg_color_space != JCS_RGB) {
      jpeg_abort_decompress(&s.cinfo);
      throw bad_image("loom: unsupported JPEG colour space (libjpeg's J_COLOR_SPACE " +
                      std::to_string(static_cast<int>(s.cinfo.jpeg_color_space)) +
                      ", " + std::to_string(header_.channels) + " components): expected grey, YCbCr or RGB");
    }
  } else if (n >= 8 && std::memcmp(bytes, png_magic, 8) == 0) {
    spng_ctx* ctx = spng_ctx_new(0);
    if (!ctx) throw bad_image("loom: cannot create libspng's decoder (out of memory)");
    png_ = ctx;
    // Limits: no dimension above what max_pixels allows; text and other chunks up to 16 MiB.
    const auto side = static_cast<std::uint32_t>(std::min<std::size_t>(max_pixels_, 0x7fffffff));
    spng_set_image_limits(ctx, side, side);
    spng_set_chunk_limits(ctx, std::size_t{16} << 20, std::size_t{64} << 20);
    spng_ihdr ihdr{};
    int e = spng_set_png_buffer(ctx, bytes, n);
    if (!e) e = spng_get_ihdr(ctx, &ihdr);
    if (e) {
      close_png();
      throw bad_image("loom: corrupt PNG header (" + std::to_string(n) + " bytes): " + spng_strerror(e));
    }
    header_.format = image_format::png;
    header_.width = ihdr.width;
    header_.height = ihdr.height;
    header_.bit_depth = ihdr.bit_depth;
    switch (ihdr.color_type) {
      case SPNG_COLOR_TYPE_GRAYSCALE: header_.channels = 1; break;
      case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: header_.channels = 2; break;
      case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: header_.channels = 4; break;
      default: header_.channels = 3; break;  // truecolor, indexed
    }
    if (ihdr.color_type == SPNG_COLOR_TYPE_INDEXED) header_.bit_depth = 8;
  } else if (n == 0) {
    throw bad_image("loom: empty image (0 bytes): expected a JPEG or PNG file");
  } else {
    throw bad_image("loom: unknown image format: expected a JPEG (starting FF D8 FF) or PNG (89 50 4E 47 0D 0A 1A 0A) file, found " +
                    std::to_string(n) + " bytes starting " + detail::first_bytes(encoded));
  }
  const char* format = to_string(header_.format);
  if (header_.width == 0 || header_.height == 0) {
    close_png();
    throw bad_image(std::string("loom: ") + format + " image of zero size (" +
                    detail::size_text(header_.width, header_.height) + "): expected at least 1 x 1 pixels");
  }
  if (header_.width > max_pixels_ / header_.height) {
    if (header_.format == image_format::jpeg) jpeg_abort_decompress(&scratch_->jpeg->cinfo);
    close_png();
    throw bad_image(std::string("loom: ") + format + " image of " + detail::size_text(header_.width, header_.height) +
                    " pixels: expected at most " + std::to_string(max_pixels_) + " pixels (the decoder's limit)");
  }
  open_ = true;
  return header_;
}

inline pixel_region image_reader::decode(const region_request& r) {
  if (!open_) throw invalid_argument("loom: image_reader::decode: expected open() first");
  if (r.channels != 1 && r.channels != 3)
    throw invalid_argument("loom: image_reader::decode: expected 1 or 3 channels, found " + std::to_string(r.channels));
  if (r.reduction != 1 && r.reduction != 2 && r.reduction != 4 && r.reduction != 8)
    throw invalid_argument("loom: image_reader::decode: expected a reduction of 1, 2, 4 or 8, found " +
                           std::to_string(r.reduction));
  open_ = false;
  pixel_region out;
  out.reduction = r.reduction;
  out.bytes_per_pixel = r.channels == 1 ? 1 : 4;
  const auto bpp = static_cast<std::size_t>(out.bytes_per_pixel);

  auto check_window = [&](std::size_t iw, std::size_t ih) {
    out.image_width = iw;
    out.image_height = ih;
    out.x0 = r.x;
    out.y0 = r.y;
    out.width = r.width ? r.width : iw;
    out.height = r.height ? r.height : ih;
    if (out.x0 > iw || out.width > iw - out.x0 || out.y0 > ih || out.height > ih - out.y0)
      throw invalid_argument("loom: image_reader::decode: the window " + detail::size_text(out.width, out.height) +
                             " at (" + std::to_string(out.x0) + ", " + std::to_string(out.y0) +
                             ") is outside the decoded image of " + detail::size_text(iw, ih) + " pixels");
  };

  if (header_.format == image_format::jpeg) {
    detail::jpeg_state& s = *scratch_->jpeg;
    detail::jpeg_decode_args a;
    a.reduction = r.reduction;
    if (!detail::jpeg_output_size_guarded(s, a))
      throw bad_image(std::string("loom: corrupt JPEG: ") + detail::jpeg_message(s));
    check_window(a.output_width, a.output_height);
    a.out_space = r.channels == 1 ? JCS_GRAYSCALE : JCS_EXT_RGBX;
    a.x = static_cast<JDIMENSION>(out.x0);
    a.width = static_cast<JDIMENSION>(out.width);
    a.y = static_cast<JDIMENSION>(out.y0);
    a.height = static_cast<JDIMENSION>(out.height);
    // The crop reaches one iMCU (at most 32 pixels: 4:1 sampling) beyond the window on each
    // side, and its left edge moves to the block grid: at most 3 iMCUs more.
    a.stride = (out.width + 96) * bpp;
    if (scratch_->pixels.size() < a.stride * out.height) scratch_->pixels.resize(a.stride * out.height);  // grows only: no zeroing per image
    a.buffer = scratch_->pixels.data();
    if (!detail::jpeg_decode_guarded(s, a))
      throw bad_image(std::string("loom: corrupt JPEG data (") + detail::size_text(header_.width, header_.height) +
                      " pixels, " + std::to_string(encoded_.size()) + " bytes): " + detail::jpeg_message(s));
    out.data = scratch_->pixels.data();
    out.stride = a.stride;
    out.x0 = a.x;
    out.width = a.width;
    return out;
  }

  // PNG: the whole image, decoded at once (libspng); the region is a view into it.
  auto* ctx = static_cast<spng_ctx*>(png_);
  struct closer {
    image_reader* self;
    ~closer() { self->close_png(); }
  } close{this};
  if (r.reduction != 1)
    throw invalid_argument("loom: image_reader::decode: a PNG is decoded at full size: expected a reduction of 1, found " +
                           std::to_string(r.reduction));
  check_window(header_.width, header_.height);
  spng_ihdr ihdr{};
  spng_get_ihdr(ctx, &ihdr);
  const bool grey8 = r.channels == 1 && ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth <= 8;
  const int fmt = grey8 ? SPNG_FMT_G8 : SPNG_FMT_RGBA8;
  std::size_t len = 0;
  int e = spng_decoded_image_size(ctx, fmt, &len);
  if (!e) {
    if (scratch_->pixels.size() < len) scratch_->pixels.resize(len);
    e = spng_decode_image(ctx, scratch_->pixels.data(), len, fmt, 0);
  }
  if (e)
    throw bad_image(std::string("loom: corrupt PNG data (") + detail::size_text(header_.width, header_.height) +
                    " pixels, " + std::to_string(encoded_.size()) + " bytes): " + spng_strerror(e));
  std::uint8_t* px = scratch_->pixels.data();
  const std::size_t count = header_.width * header_.height;
  if (r.channels == 1 && !grey8) {
    for (std::size_t i = 0; i < count; ++i) px[i] = detail::luma(px[4 * i], px[4 * i + 1], px[4 * i + 2]);
  }
  out.stride = header_.width * bpp;
  out.data = px + out.y0 * out.stride + out.x0 * bpp;
  return out;
}

inline std::vector<std::uint8_t> decode_image(std::span<const std::byte> encoded, int channels, image_header* header) {
  image_reader reader(this_thread_image_scratch());
  const image_header h = reader.open(encoded);
  if (header) *header = h;
  const pixel_region r = reader.decode({.channels = channels});
  std::vector<std::uint8_t> out(h.width * h.height * static_cast<std::size_t>(channels));
  const auto c = static_cast<std::size_t>(channels);
  for (std::size_t y = 0; y < h.height; ++y)
    for (std::size_t x = 0; x < h.width; ++x)
      for (std::size_t k = 0; k < c; ++k) out[(y * h.width + x) * c + k] = r.at(x, y, static_cast<int>(k));
  return out;
}

}  // namespace loom::data
