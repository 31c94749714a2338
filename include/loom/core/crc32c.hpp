// SPDX-License-Identifier: Apache-2.0
#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of loom's checkpoints
// and of TensorBoard's TFRecord framing. On x86-64 CPUs with SSE 4.2 it runs on the crc32
// instruction (about 8 bytes a cycle per stream; chosen at run time); elsewhere on a
// slice-by-8 table. crc32c(data, n, crc) continues a checksum: crc32c(b, crc32c(a)) is the
// checksum of a followed by b. Check value: crc32c("123456789") == 0xE3069283.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loom {

namespace detail {
inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;

constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? crc32c_poly : 0u);
    t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i)
    for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
  return t;
}
inline constexpr auto crc32c_table = crc32c_tables();

/// The table version: raw (un-inverted) state in, raw state out.
inline std::uint32_t crc32c_sw(std::uint32_t c, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = crc32c_table;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts (loom's io asserts it)
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8, n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
  return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/// The SSE 4.2 version (same state convention).
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw(std::uint32_t c, const unsigned char* p,
                                                                   std::size_t n) noexcept {
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8, n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
inline bool crc32c_hw_available() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif
}  // namespace detail

/// The CRC-32C of n bytes at data, continuing from crc (0 to start).
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (detail::crc32c_hw_available()) return ~detail::crc32c_hw(c, p, n);
#endif
  return ~detail::crc32c_sw(c, p, n);
}

/// The checksum as 8 lowercase hex digits (how loom's files write it).
inline std::array<char, 9> crc32c_hex(std::uint32_t crc) noexcept {
  std::array<char, 9> s{};
  constexpr char digits[] = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = digits[(crc >> (28 - 4 * i)) & 0xFu];
  return s;
}

}  // namespace loom
