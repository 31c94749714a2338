// SPDX-License-Identifier: Apache-2.0
#pragma once
// A protocol-buffers encoder, the few wire types ONNX files need: varints (int32, int64, enums,
// bools), 32-bit floats, and length-delimited fields (strings, bytes, nested messages). It
// writes; it does not parse, and it knows no schema: io/onnx.hpp names the field numbers of
// onnx.proto. loom uses it instead of libprotobuf so that exporting needs no library at run time.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace loom::io::protobuf {

/// The wire types used here.
enum class wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

/// One encoded message, built field by field; nest it with message(field, m).
class message {
 public:
  /// An int32, int64, uint64, enum or bool field. Negative values take ten bytes, as protobuf
  /// encodes int32 and int64 (two's complement, sign-extended to 64 bits).
  message& varint(std::uint32_t field, std::int64_t v) {
    tag(field, wire::varint);
    put_varint(static_cast<std::uint64_t>(v));
    return *this;
  }
  /// A float field (fixed32, little-endian).
  message& fixed32(std::uint32_t field, float v) {
    tag(field, wire::fixed32);
    const auto u = std::bit_cast<std::uint32_t>(v);
    for (int i = 0; i < 4; ++i) bytes_ += static_cast<char>((u >> (8 * i)) & 0xff);
    return *this;
  }
  /// A string or bytes field.
  message& bytes(std::uint32_t field, std::string_view v) {
    tag(field, wire::length_delimited);
    put_varint(v.size());
    bytes_.append(v);
    return *this;
  }
  /// A bytes field of n raw bytes at p.
  message& bytes(std::uint32_t field, const void* p, std::size_t n) {
    return bytes(field, std::string_view(static_cast<const char*>(p), n));
  }
  /// A nested message field.
  message& nested(std::uint32_t field, const message& m) { return bytes(field, m.bytes_); }

  /// The encoded bytes.
  const std::string& encoded() const noexcept { return bytes_; }
  std::size_t size() const noexcept { return bytes_.size(); }

 private:
  void tag(std::uint32_t field, wire w) { put_varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint32_t>(w)); }
  void put_varint(std::uint64_t v) {
    while (v >= 0x80) {
      bytes_ += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    bytes_ += static_cast<char>(v);
  }
  std::string bytes_;
};

}  // namespace loom::io::protobuf
