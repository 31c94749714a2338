// SPDX-License-Identifier: Apache-2.0
// The ONNX exporter in C++: the protobuf encoding against protobuf's documented bytes, fp16
// rounding against the compiler's, the model's opening fields, external data, and exports that
// cannot be written. onnx's checker and ONNX Runtime check the exported files in check_onnx.py.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cases.hpp"
#include "error_message.hpp"
#include "loom/io/onnx.hpp"
#include "test_files.hpp"

using Catch::Matchers::Contains;

namespace {
std::string hex(const std::string& s) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15], out += ' ';
  if (!out.empty()) out.pop_back();
  return out;
}
}  // namespace

TEST_CASE("The protobuf encoder writes varints, floats, strings and nested messages as protobuf does", "[io][onnx]") {
  using loom::io::protobuf::message;
  // The examples of protobuf's encoding guide.
  CHECK(hex(message{}.varint(1, 150).encoded()) == "08 96 01");
  CHECK(hex(message{}.bytes(2, "testing").encoded()) == "12 07 74 65 73 74 69 6e 67");
  CHECK(hex(message{}.nested(3, message{}.varint(1, 150)).encoded()) == "1a 03 08 96 01");
  // int64 -1: ten bytes, two's complement.
  CHECK(hex(message{}.varint(2, -1).encoded()) == "10 ff ff ff ff ff ff ff ff ff 01");
  CHECK(hex(message{}.fixed32(2, 1.0f).encoded()) == "15 00 00 80 3f");
  // A field number past 15 takes a two-byte tag.
  CHECK(hex(message{}.varint(20, 2).encoded()) == "a0 01 02");
}

TEST_CASE("fp16 weights round to nearest even exactly as the compiler's _Float16 conversion", "[io][onnx]") {
  std::vector<float> xs{0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65520.0f, 1e9f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 1e-10f,
                        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits(rng);
    float x;
    std::memcpy(&x, &u, sizeof x);
    if (!std::isnan(x)) xs.push_back(x);
  }
  for (int i = 0; i < 100000; ++i) xs.push_back(std::ldexp(static_cast<float>(bits(rng) % 4096) / 4096.0f + 1.0f, -14 - i % 12));
  std::size_t mismatches = 0;
  for (float x : xs) {
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t want;
    std::memcpy(&want, &h, sizeof want);
    if (loom::io::detail::fp16_bits(x) != want && ++mismatches < 5) FAIL_CHECK("x = " << x << " (" << std::hexfloat << x << ")");
  }
  CHECK(mismatches == 0);
  CHECK((loom::io::detail::fp16_bits(std::numeric_limits<float>::quiet_NaN()) & 0x7c00u) == 0x7c00u);
  CHECK((loom::io::detail::fp16_bits(std::numeric_limits<float>::quiet_NaN()) & 0x3ffu) != 0);
}

TEST_CASE("An exported model opens with IR version 8 and names loom and the network", "[io][onnx]") {
  io_test::scratch_dir dir("model");
  const auto p = io_cases::parameters<io_cases::mlp>(1);
  loom::export_onnx<io_cases::mlp>(p, dir / "mlp.onnx");  // a whole flat buffer, as trainer::gather_parameters() gives
  const std::string bytes = io_test::read_bytes(dir / "mlp.onnx");
  CHECK(hex(bytes.substr(0, 2)) == "08 08");  // field 1 (ir_version), varint 8
  CHECK(bytes.size() > p.size() * sizeof(float));  // the weights are inline
  CHECK(bytes.find(loom::io::describe<io_cases::mlp>().text()) != std::string::npos);
  CHECK(bytes.find("4.weight") != std::string::npos);
  CHECK(bytes.find(std::string(reinterpret_cast<const char*>(p.data()), 64)) != std::string::npos);
  CHECK(dir.files() == std::vector<std::string>{"mlp.onnx"});
}

TEST_CASE("External data puts every weight in the data file at page-aligned offsets, and an inline export drops it",
          "[io][onnx]") {
  io_test::scratch_dir dir("external");
  const auto p = io_cases::parameters<io_cases::mlp>(1);
  const auto model = dir / "m.onnx";
  loom::export_onnx<io_cases::mlp>(std::span<const float>(p), model, {.external_data = loom::onnx_external_data::always});
  const std::string data = io_test::read_bytes(dir / "m.onnx.data");
  const std::string onnx = io_test::read_bytes(model);
  CHECK(onnx.size() < 4096);
  CHECK(onnx.find("m.onnx.data") != std::string::npos);
  // 0.weight at 0, 0.bias at the first page boundary after it.
  const std::size_t w0 = 256 * 784 * sizeof(float);
  REQUIRE(data.size() >= p.size() * sizeof(float));
  CHECK(std::memcmp(data.data(), p.data(), w0) == 0);
  const std::size_t b0 = (w0 + 4095) / 4096 * 4096;
  CHECK(std::memcmp(data.data() + b0, p.data() + 256 * 784, 256 * sizeof(float)) == 0);
  loom::export_onnx<io_cases::mlp>(std::span<const float>(p), model);
  CHECK(dir.files() == std::vector<std::string>{"m.onnx"});
}

TEST_CASE("External data is chosen past what one protobuf holds, and refused where never is asked", "[io][onnx]") {
  using loom::io::detail::onnx_external;
  using mode = loom::onnx_external_data;
  const std::uint64_t gib2 = std::uint64_t{1} << 31;
  CHECK_FALSE(onnx_external(1000, mode::automatic, "m.onnx"));
  CHECK(onnx_external(1000, mode::always, "m.onnx"));
  CHECK(onnx_external(gib2, mode::automatic, "m.onnx"));
  CHECK_FALSE(onnx_external(gib2 - (std::uint64_t{1} << 25), mode::never, "m.onnx"));
  CHECK_THROWS_WITH(onnx_external(gib2, mode::never, "m.onnx"),
                    Contains("m.onnx") && Contains("more than one ONNX protobuf holds (2 GiB)"));
}

TEST_CASE("An export that cannot be written fails with a sentence and leaves no file", "[io][onnx]") {
  io_test::scratch_dir dir("unwritable");
  const auto p = io_cases::parameters<io_cases::linear>(1);
  auto message_of = [&](const std::filesystem::path& path, loom::onnx_options o = {}) {
    return loom::testing::error_message<loom::io_error>(
        [&] { loom::export_onnx<io_cases::linear>(std::span<const float>(p), path, o); }, "loom::io_error");
  };
  SECTION("a directory that does not exist") {
    const std::string m = message_of(dir / "nowhere" / "m.onnx");
    CHECK_THAT(m, Contains("cannot write") && Contains("nowhere/m.onnx") &&
                      Contains("the directory " + (dir / "nowhere").string() + " does not exist") &&
                      Contains("nothing was written in its place"));
    CHECK(message_of(dir / "nowhere" / "m.onnx", {.external_data = loom::onnx_external_data::always}) != "(no loom::io_error)");
  }
  SECTION("a path under a file") {
    io_test::write_bytes(dir / "plain", "x");
    CHECK_THAT(message_of(dir / "plain" / "m.onnx"), Contains("is not a directory"));
    CHECK(dir.files() == std::vector<std::string>{"plain"});
  }
  SECTION("a directory that is not writable") {
    // /proc refuses new files even to root (the tests run as root in CI, where permissions do not).
    const std::string m = message_of("/proc/loom-test.onnx");
    CHECK_THAT(m, Contains("cannot write /proc/loom-test.onnx") && Contains("not writable") &&
                      Contains("nothing was written in its place"));
    CHECK_FALSE(std::filesystem::exists("/proc/loom-test.onnx"));
  }
  CHECK(std::filesystem::exists(dir.path()));
}
