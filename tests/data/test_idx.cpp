// SPDX-License-Identifier: Apache-2.0
// Tests of loom::data::read_idx: good raw and gzip files, and one test per way a file can be broken,
// each checking that the message names the file, what was expected and what was found.

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/idx.hpp"
#include "test_files.hpp"

using Catch::Matchers::Contains;
using loom_test::idx_bytes;
using loom_test::idx_ubyte;
using loom_test::some_bytes;
using loom_test::temp_dir;
using loom_test::write_gz;
using loom_test::write_raw;

namespace {

/// The message of the loom::error that read_idx(file, rank) throws, and its kind.
template <class E>
std::string message_of(const std::filesystem::path& file, std::size_t rank) {
  try {
    (void)loom::data::read_idx(file, rank);
  } catch (const E& e) {
    return e.what();
  }
  FAIL("read_idx(" << file << ", " << rank << ") did not throw the expected exception");
  return {};
}

}  // namespace

TEST_CASE("A good raw file and a good gzip file read identically", "[data]") {
  temp_dir dir;
  const auto data = some_bytes(3 * 4 * 5);
  const auto bytes = idx_ubyte({3, 4, 5}, data);
  const auto raw = write_raw(dir / "images-idx3-ubyte", bytes);
  const auto gz = write_gz(dir / "images-idx3-ubyte.gz", bytes);

  const loom::data::idx_array a = loom::data::read_idx(raw, 3);
  const loom::data::idx_array b = loom::data::read_idx(gz, 3);
  CHECK(a.path == raw);
  CHECK(b.path == gz);
  CHECK(a.dims == std::vector<std::uint32_t>{3, 4, 5});
  CHECK(b.dims == a.dims);
  CHECK(a.data == data);
  CHECK(b.data == data);
}

TEST_CASE("Compression is detected from the gzip magic bytes, not from the file name", "[data]") {
  temp_dir dir;
  const auto data = some_bytes(7);
  const auto gz_named_raw = write_gz(dir / "labels-idx1-ubyte", idx_ubyte({7}, data));
  const auto raw_named_gz = write_raw(dir / "labels-idx1-ubyte.gz", idx_ubyte({7}, data));
  CHECK(loom::data::read_idx(gz_named_raw, 1).data == data);
  CHECK(loom::data::read_idx(raw_named_gz, 1).data == data);
}

TEST_CASE("A gzip file of several concatenated members reads as one stream", "[data]") {
  temp_dir dir;
  const auto data = some_bytes(50);
  const auto bytes = idx_ubyte({50}, data);
  const auto first =
      loom_test::read_bytes(write_gz(dir / "a.gz", {bytes.begin(), bytes.begin() + 20}));
  const auto second =
      loom_test::read_bytes(write_gz(dir / "b.gz", {bytes.begin() + 20, bytes.end()}));
  std::vector<std::uint8_t> both = first;
  both.insert(both.end(), second.begin(), second.end());
  CHECK(loom::data::read_idx(write_raw(dir / "both.gz", both), 1).data == data);
}

TEST_CASE("A file with no data because its count is zero reads as empty", "[data]") {
  temp_dir dir;
  const auto file = write_raw(dir / "none", idx_ubyte({0, 28, 28}, {}));
  const auto got = loom::data::read_idx(file, 3);
  CHECK(got.dims == std::vector<std::uint32_t>{0, 28, 28});
  CHECK(got.data.empty());
}

TEST_CASE("A missing file is reported with its path and the system's reason", "[data]") {
  temp_dir dir;
  const auto file = dir / "train-images-idx3-ubyte.gz";
  const std::string msg = message_of<loom::io_error>(file, 3);
  CHECK_THAT(msg, Contains(file.string()));
  CHECK_THAT(msg, Contains("cannot open"));
  CHECK_THAT(msg, Contains("No such file or directory"));
}

TEST_CASE("A directory in place of a file is reported as a read failure", "[data]") {
  temp_dir dir;
  const std::string msg = message_of<loom::io_error>(dir.path(), 3);
  CHECK_THAT(msg, Contains(dir.path().string()));
  CHECK_THAT(msg, Contains("Is a directory"));
}

TEST_CASE("A wrong magic number is reported with the expected and the found value", "[data]") {
  temp_dir dir;
  for (bool gz : {false, true}) {
    const auto bytes = idx_bytes(0x12345678u, {1, 1, 1}, {0});
    const auto file = gz ? write_gz(dir / "train-images-idx3-ubyte.gz", bytes)
                         : write_raw(dir / "train-images-idx3-ubyte", bytes);
    const std::string msg = message_of<loom::data_error>(file, 3);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg,
               Contains("wrong magic number: expected 0x00000803 (unsigned bytes, 3 dimensions), "
                        "found 0x12345678"));
  }
}

TEST_CASE("A labels file read as images names both magic numbers in words", "[data]") {
  temp_dir dir;
  const auto file = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  const std::string msg = message_of<loom::data_error>(file, 3);
  CHECK_THAT(msg, Contains(file.string()));
  CHECK_THAT(msg, Contains("expected 0x00000803 (unsigned bytes, 3 dimensions)"));
  CHECK_THAT(msg, Contains("found 0x00000801 (unsigned bytes, 1 dimension)"));
}

TEST_CASE("A file of another element type is reported as a wrong magic number", "[data]") {
  temp_dir dir;
  const auto file = write_raw(dir / "floats", idx_bytes(0x00000D02u, {1, 1}, {0, 0, 0, 0}));
  const std::string msg = message_of<loom::data_error>(file, 2);
  CHECK_THAT(msg, Contains("expected 0x00000802 (unsigned bytes, 2 dimensions)"));
  CHECK_THAT(msg, Contains("found 0x00000D02 (32-bit floats, 2 dimensions)"));
}

TEST_CASE("Truncated data is reported with the promised and the found byte count", "[data]") {
  temp_dir dir;
  auto bytes = idx_ubyte({60, 28, 28}, some_bytes(1234));
  for (bool gz : {false, true}) {
    const auto file = gz ? write_gz(dir / "train-images-idx3-ubyte.gz", bytes)
                         : write_raw(dir / "train-images-idx3-ubyte", bytes);
    const std::string msg = message_of<loom::data_error>(file, 3);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg,
               Contains("file is truncated: header promises 60 x 28 x 28 = 47040 bytes of data, "
                        "found 1234"));
  }
}

TEST_CASE("Truncated one-dimensional data states the promise without a product", "[data]") {
  temp_dir dir;
  const auto file = write_raw(dir / "labels", idx_ubyte({10}, {1, 2, 3}));
  const std::string msg = message_of<loom::data_error>(file, 1);
  CHECK_THAT(msg, Contains(file.string()));
  CHECK_THAT(msg, Contains("header promises 10 bytes of data, found 3"));
}

TEST_CASE("A header whose size does not fit in memory is reported, not allocated", "[data]") {
  temp_dir dir;
  const auto huge =
      write_raw(dir / "huge", idx_ubyte({0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {1, 2}));
  const std::string msg = message_of<loom::data_error>(huge, 3);
  CHECK_THAT(msg, Contains(huge.string()));
  CHECK_THAT(msg, Contains("header promises 4294967295 x 4294967295 x 4294967295 bytes of data"));
  CHECK_THAT(msg, Contains("expected a size that fits in memory"));

  // Large but addressable: the reader must find the file short without allocating it all.
  const auto big = write_raw(dir / "big", idx_ubyte({0x7FFFFFFFu, 0xFFFFFFFFu}, {1, 2}));
  CHECK_THAT(message_of<loom::data_error>(big, 2),
             Contains("= 9223372030412324865 bytes of data, found 2"));
}

TEST_CASE("Trailing bytes after the data are reported with their count", "[data]") {
  temp_dir dir;
  auto bytes = idx_ubyte({2, 2, 2}, some_bytes(8));
  const auto extra = some_bytes(10, 7);
  bytes.insert(bytes.end(), extra.begin(), extra.end());
  for (bool gz : {false, true}) {
    const auto file = gz ? write_gz(dir / "images.gz", bytes) : write_raw(dir / "images", bytes);
    const std::string msg = message_of<loom::data_error>(file, 3);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg, Contains("10 unexpected bytes after the data"));
    CHECK_THAT(msg, Contains("expected exactly 2 x 2 x 2 = 8 bytes"));
  }
}

TEST_CASE("A corrupt gzip stream is reported with zlib's message", "[data]") {
  temp_dir dir;
  const auto good =
      loom_test::read_bytes(write_gz(dir / "good.gz", idx_ubyte({100}, some_bytes(100))));
  REQUIRE(good.size() > 18);

  SECTION("an invalid deflate block") {
    auto bad = good;
    bad[10] = 0x07;  // first block: final, block type 3 (reserved)
    const auto file = write_raw(dir / "train-labels-idx1-ubyte.gz", bad);
    const std::string msg = message_of<loom::data_error>(file, 1);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg, Contains("corrupt gzip stream: invalid block type"));
  }
  SECTION("a wrong checksum") {
    auto bad = good;
    bad[bad.size() - 8] ^= 0xFF;  // CRC-32 in the trailer
    const auto file = write_raw(dir / "train-labels-idx1-ubyte.gz", bad);
    const std::string msg = message_of<loom::data_error>(file, 1);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg, Contains("corrupt gzip stream: incorrect data check"));
  }
  SECTION("a cut-off stream") {
    const std::vector<std::uint8_t> cut(good.begin(), good.end() - 5);
    const auto file = write_raw(dir / "train-labels-idx1-ubyte.gz", cut);
    const std::string msg = message_of<loom::data_error>(file, 1);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg, Contains("gzip stream is truncated"));
    CHECK_THAT(msg, Contains("found the end of the file"));
  }
  SECTION("garbage after the gzip stream") {
    auto bad = good;
    bad.push_back(0x00);
    bad.push_back(0x42);
    const auto file = write_raw(dir / "train-labels-idx1-ubyte.gz", bad);
    const std::string msg = message_of<loom::data_error>(file, 1);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg, Contains("corrupt gzip stream"));
  }
}

TEST_CASE("An empty file is reported as empty with the magic number expected", "[data]") {
  temp_dir dir;
  for (bool gz : {false, true}) {
    const auto file = gz ? write_gz(dir / "empty.gz", {}) : write_raw(dir / "empty", {});
    const std::string msg = message_of<loom::data_error>(file, 3);
    CHECK_THAT(msg, Contains(file.string()));
    CHECK_THAT(msg, Contains("file is empty: expected an IDX file starting with the magic number "
                             "0x00000803 (unsigned bytes, 3 dimensions), found 0 bytes"));
  }
}

TEST_CASE("A file cut inside its header is reported with the header size expected", "[data]") {
  temp_dir dir;
  const auto bytes = idx_ubyte({60000, 28, 28}, {});
  const auto magic_only = write_raw(dir / "two", {bytes.begin(), bytes.begin() + 2});
  CHECK_THAT(message_of<loom::data_error>(magic_only, 3),
             Contains("expected a 4-byte magic number 0x00000803 (unsigned bytes, 3 dimensions), "
                      "found 2 bytes"));
  const auto part = write_raw(dir / "nine", {bytes.begin(), bytes.begin() + 9});
  const std::string msg = message_of<loom::data_error>(part, 3);
  CHECK_THAT(msg, Contains(part.string()));
  CHECK_THAT(msg,
             Contains("expected a 16-byte header (magic number and 3 dimensions), found 9 bytes"));
  const auto header_only = write_raw(dir / "header", bytes);
  CHECK_THAT(message_of<loom::data_error>(header_only, 3),
             Contains("header promises 60000 x 28 x 28 = 47040000 bytes of data, found 0"));
}

TEST_CASE("A rank outside 1..255 is an invalid argument", "[data]") {
  temp_dir dir;
  const auto file = write_raw(dir / "labels", idx_ubyte({1}, {0}));
  CHECK_THROWS_AS(loom::data::read_idx(file, 0), loom::invalid_argument);
  CHECK_THROWS_AS(loom::data::read_idx(file, 256), loom::invalid_argument);
}

TEST_CASE("Garbage, cut and mutated files throw loom errors and never crash", "[data]") {
  temp_dir dir;
  const auto good_raw = idx_ubyte({3, 5, 4}, some_bytes(60, 3));
  const auto good_gz = loom_test::read_bytes(write_gz(dir / "good.gz", good_raw));
  std::vector<std::vector<std::uint8_t>> inputs;
  for (std::size_t n = 0; n <= good_raw.size() + 2; ++n) {
    inputs.push_back(some_bytes(n, static_cast<std::uint32_t>(n) + 100));
    auto gz_magic = some_bytes(n, static_cast<std::uint32_t>(n) + 200);
    gz_magic.insert(gz_magic.begin(), {0x1F, 0x8B});
    inputs.push_back(gz_magic);
  }
  for (const auto* good : {&good_raw, &good_gz}) {
    for (std::size_t n = 0; n < good->size(); ++n)
      inputs.emplace_back(good->begin(), good->begin() + n);
    for (std::size_t i = 0; i < good->size(); ++i) {
      for (std::uint8_t flip : {0x01, 0x80, 0xFF}) {
        auto bad = *good;
        bad[i] ^= flip;
        inputs.push_back(bad);
      }
    }
  }
  std::size_t accepted = 0;
  std::size_t rejected = 0;
  const auto file = dir / "fuzz";
  for (const auto& input : inputs) {
    write_raw(file, input);
    try {
      const auto got = loom::data::read_idx(file, 3);
      std::size_t total = 1;
      for (auto d : got.dims) total *= d;
      CHECK(got.data.size() == total);
      ++accepted;
    } catch (const loom::error& e) {
      CHECK_THAT(std::string(e.what()), Contains(file.string()));
      ++rejected;
    }
  }
  CHECK(accepted + rejected == inputs.size());
  CHECK(rejected > 0);
}
