// SPDX-License-Identifier: Apache-2.0
// Tests of loom::data::labelled_images and the MNIST / Fashion-MNIST loaders: consistency checks
// between images and labels, file-name resolution, and the real data set when it is installed.

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/data/dataset.hpp"
#include "test_files.hpp"

using Catch::Matchers::Contains;
using loom_test::idx_ubyte;
using loom_test::some_bytes;
using loom_test::temp_dir;
using loom_test::write_gz;
using loom_test::write_raw;

namespace {

using tiny_set = loom::data::labelled_images<loom::shape<1, 4, 4>, 10>;

template <class Set>
std::string from_idx_message(const std::filesystem::path& images,
                             const std::filesystem::path& labels) {
  try {
    (void)Set::from_idx(images, labels);
  } catch (const loom::data_error& e) {
    return e.what();
  }
  FAIL("from_idx(" << images << ", " << labels << ") did not throw loom::data_error");
  return {};
}

/// Writes a set of n 28 x 28 images with labels i % 10 in the MNIST file layout.
void write_mnist_layout(const std::filesystem::path& dir, const std::string& prefix,
                        std::uint32_t n, bool gz) {
  std::vector<std::uint8_t> labels(n);
  for (std::uint32_t i = 0; i < n; ++i) labels[i] = static_cast<std::uint8_t>(i % 10);
  const auto images = idx_ubyte({n, 28, 28}, some_bytes(std::size_t{n} * 784, n));
  const auto label_file = idx_ubyte({n}, labels);
  const std::string ext = gz ? ".gz" : "";
  auto write = gz ? write_gz : write_raw;
  write(dir / (prefix + "-images-idx3-ubyte" + ext), images);
  write(dir / (prefix + "-labels-idx1-ubyte" + ext), label_file);
}

}  // namespace

TEST_CASE("A set loads from good raw and gzip IDX files with its pixels and labels", "[data]") {
  temp_dir dir;
  const auto pixels = some_bytes(3 * 16);
  const std::vector<std::uint8_t> labels{4, 0, 9};
  for (bool gz : {false, true}) {
    auto write = gz ? write_gz : write_raw;
    const auto images = write(dir / (gz ? "img.gz" : "img"), idx_ubyte({3, 4, 4}, pixels));
    const auto label_file = write(dir / (gz ? "lab.gz" : "lab"), idx_ubyte({3}, labels));
    const auto set = tiny_set::from_idx(images, label_file);
    REQUIRE(set.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(set.label(i) == labels[i]);
      CHECK(std::vector<std::uint8_t>(set.pixels(i), set.pixels(i) + 16) ==
            std::vector<std::uint8_t>(pixels.begin() + static_cast<std::ptrdiff_t>(16 * i),
                                      pixels.begin() + static_cast<std::ptrdiff_t>(16 * (i + 1))));
    }
    CHECK_THAT(set.description(), Contains(images.string()));
    CHECK_THAT(set.description(), Contains(label_file.string()));
  }
  static_assert(tiny_set::classes == 10);
  static_assert(std::is_same_v<tiny_set::sample_shape, loom::shape<1, 4, 4>>);
}

TEST_CASE("Images of any rank load when their size matches the sample shape", "[data]") {
  temp_dir dir;
  const auto images = write_raw(dir / "img", idx_ubyte({2, 16}, some_bytes(32)));
  const auto labels = write_raw(dir / "lab", idx_ubyte({2}, {1, 2}));
  CHECK(tiny_set::from_idx(images, labels).size() == 2);
}

TEST_CASE("A label out of range is reported with its value, index and the valid range", "[data]") {
  temp_dir dir;
  const auto images = write_raw(dir / "img", idx_ubyte({5, 4, 4}, some_bytes(80)));
  const auto labels = write_raw(dir / "train-labels-idx1-ubyte", idx_ubyte({5}, {1, 2, 3, 12, 4}));
  const std::string msg = from_idx_message<tiny_set>(images, labels);
  CHECK_THAT(msg, Contains(labels.string()));
  CHECK_THAT(msg, Contains("label 12 at index 3 is out of range: expected 0..9"));
}

TEST_CASE("Image and label counts that differ are reported with both files and counts", "[data]") {
  temp_dir dir;
  const auto images =
      write_raw(dir / "train-images-idx3-ubyte", idx_ubyte({3, 4, 4}, some_bytes(48)));
  const auto labels = write_raw(dir / "train-labels-idx1-ubyte", idx_ubyte({2}, {1, 2}));
  const std::string msg = from_idx_message<tiny_set>(images, labels);
  CHECK_THAT(msg, Contains("images file " + images.string() + " holds 3 images but labels file " +
                           labels.string() + " holds 2 labels"));
}

TEST_CASE("Images of the wrong size for the sample shape are reported with both sizes", "[data]") {
  temp_dir dir;
  const auto images =
      write_raw(dir / "train-images-idx3-ubyte", idx_ubyte({3, 4, 5}, some_bytes(60)));
  const auto labels = write_raw(dir / "train-labels-idx1-ubyte", idx_ubyte({3}, {1, 2, 3}));
  const std::string msg = from_idx_message<tiny_set>(images, labels);
  CHECK_THAT(msg, Contains(images.string()));
  CHECK_THAT(msg, Contains("expected 16 bytes per image for sample shape (1, 4, 4)"));
  CHECK_THAT(msg, Contains("found images of 4 x 5 = 20 bytes"));
}

TEST_CASE("A labels file with more than one dimension is reported as a wrong magic number",
          "[data]") {
  temp_dir dir;
  const auto images = write_raw(dir / "img", idx_ubyte({2, 4, 4}, some_bytes(32)));
  const auto labels = write_raw(dir / "lab", idx_ubyte({2, 1}, {1, 2}));
  const std::string msg = from_idx_message<tiny_set>(images, labels);
  CHECK_THAT(msg, Contains(labels.string()));
  CHECK_THAT(msg, Contains("expected 0x00000801 (unsigned bytes, 1 dimension), found 0x00000802"));
}

TEST_CASE("An images file with one dimension is reported as a wrong magic number", "[data]") {
  temp_dir dir;
  const auto images = write_raw(dir / "img", idx_ubyte({16}, some_bytes(16)));
  const auto labels = write_raw(dir / "lab", idx_ubyte({1}, {1}));
  const std::string msg = from_idx_message<tiny_set>(images, labels);
  CHECK_THAT(msg, Contains(images.string()));
  CHECK_THAT(msg,
             Contains("expected 0x00000802..0x000008FF (unsigned bytes, 2 or more dimensions), "
                      "found 0x00000801"));
}

TEST_CASE("A set built from vectors is checked like one read from files", "[data]") {
  CHECK(tiny_set(some_bytes(32), {1, 2}, "two images").size() == 2);
  CHECK_THROWS_WITH(
      tiny_set(some_bytes(32), {1, 10}, "synthetic"),
      Contains("synthetic") && Contains("label 10 at index 1 is out of range: expected 0..9"));
  CHECK_THROWS_WITH(tiny_set(some_bytes(33), {1, 2}, "synthetic"),
                    Contains("synthetic") && Contains("expected 2 labels x 16 bytes") &&
                        Contains("= 32 pixel bytes, found 33"));
  CHECK_THROWS_AS(tiny_set(some_bytes(33), {1, 2}), loom::data_error);
}

TEST_CASE("first(n) keeps the first n samples and rejects n beyond the size", "[data]") {
  const auto pixels = some_bytes(4 * 16);
  const tiny_set set(pixels, {3, 1, 4, 1}, "four");
  const tiny_set two = set.first(2);
  REQUIRE(two.size() == 2);
  CHECK(two.label(0) == 3);
  CHECK(two.label(1) == 1);
  CHECK(std::vector<std::uint8_t>(two.pixels(0), two.pixels(0) + 32) ==
        std::vector<std::uint8_t>(pixels.begin(), pixels.begin() + 32));
  CHECK_THAT(two.description(), Contains("four") && Contains("first 2"));
  CHECK(set.first(0).size() == 0);
  CHECK(set.first(4).size() == 4);
  CHECK_THROWS_AS(set.first(5), loom::invalid_argument);
  CHECK_THROWS_WITH(set.first(5), Contains("first(5)") && Contains("at most 4"));
}

TEST_CASE("A missing data set names both file names tried and how to install it", "[data]") {
  temp_dir dir;
  const auto missing = dir / "nowhere";
  try {
    (void)loom::data::fashion_mnist(missing, loom::data::split::test);
    FAIL("fashion_mnist did not throw");
  } catch (const loom::io_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains((missing / "t10k-images-idx3-ubyte.gz").string()));
    CHECK_THAT(msg, Contains((missing / "t10k-images-idx3-ubyte").string() + ";"));
    CHECK_THAT(msg, Contains("apt-get install dataset-fashion-mnist"));
    CHECK_THAT(msg, Contains("--data DIR"));
  }
  CHECK_THROWS_WITH(
      loom::data::mnist(missing, loom::data::split::train),
      Contains((missing / "train-images-idx3-ubyte.gz").string()) && Contains("--data DIR"));
}

TEST_CASE("The MNIST layout loads from compressed, uncompressed and mixed files", "[data]") {
  temp_dir dir;
  write_mnist_layout(dir.path(), "train", 12, true);
  write_mnist_layout(dir.path(), "t10k", 5, false);
  const auto train = loom::data::mnist(dir.path(), loom::data::split::train);
  const auto test = loom::data::fashion_mnist(dir.path(), loom::data::split::test);
  CHECK(train.size() == 12);
  CHECK(test.size() == 5);
  CHECK(train.label(11) == 1);
  CHECK_THAT(train.description(),
             Contains("MNIST train") && Contains("train-images-idx3-ubyte.gz"));
  CHECK_THAT(test.description(),
             Contains("Fashion-MNIST test") && Contains("t10k-labels-idx1-ubyte"));

  // Only the labels missing: the message names the labels.
  std::filesystem::remove(dir / "t10k-labels-idx1-ubyte");
  CHECK_THROWS_WITH(loom::data::mnist(dir.path(), loom::data::split::test),
                    Contains("MNIST test labels not found") &&
                        Contains((dir / "t10k-labels-idx1-ubyte.gz").string()));
}

TEST_CASE("The installed Fashion-MNIST has 60000 train and 10000 test samples of 10 classes",
          "[data]") {
  if (!std::filesystem::exists(loom::data::default_fashion_mnist_dir)) {
    WARN("skipped: " << loom::data::default_fashion_mnist_dir << " does not exist");
    return;
  }
  static_assert(std::is_same_v<loom::data::fashion_mnist_set::sample_shape, loom::shape<1, 28, 28>>);
  static_assert(loom::data::fashion_mnist_set::classes == 10);
  for (auto [s, n] : {std::pair{loom::data::split::test, std::size_t{10000}},
                      std::pair{loom::data::split::train, std::size_t{60000}}}) {
    const auto set = loom::data::fashion_mnist(s);
    REQUIRE(set.size() == n);
    std::array<std::size_t, 10> per_class{};
    for (std::size_t i = 0; i < set.size(); ++i) ++per_class[set.label(i)];
    for (std::size_t c = 0; c < 10; ++c) CHECK(per_class[c] == n / 10);  // balanced classes
    CHECK_THAT(set.description(), Contains(loom::data::default_fashion_mnist_dir));
  }
}
