// SPDX-License-Identifier: Apache-2.0
// CRC-32C: the standard check value, the hardware path against the table path on every length
// and alignment, and continuation (a checksum of two pieces is the checksum of the whole).

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "loom/core/crc32c.hpp"

TEST_CASE("crc32c: the standard check values", "[crc32c]") {
  CHECK(loom::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(loom::crc32c("", 0) == 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, and of 0xFF.
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  CHECK(loom::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(loom::crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(std::string(loom::crc32c_hex(0xE3069283u).data()) == "e3069283");
}

TEST_CASE("crc32c: every path agrees on every length and alignment, and continues", "[crc32c]") {
  std::mt19937 g(7);
  std::vector<unsigned char> v(4099);
  for (auto& x : v) x = static_cast<unsigned char>(g());
  for (std::size_t at = 0; at < 9; ++at)
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 1000u, 4090u}) {
      const std::uint32_t table = ~loom::detail::crc32c_sw(~0u, v.data() + at, n);
      REQUIRE(loom::crc32c(v.data() + at, n) == table);
      for (std::size_t cut : {std::size_t{0}, n / 3, n}) {
        const std::uint32_t first = loom::crc32c(v.data() + at, cut);
        REQUIRE(loom::crc32c(v.data() + at + cut, n - cut, first) == table);
      }
    }
}
