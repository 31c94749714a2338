// SPDX-License-Identifier: Apache-2.0
#pragma once
// In-memory labelled image sets (uint8 pixels, uint8 labels) and loaders for MNIST and
// Fashion-MNIST from their IDX files, checked for consistency before any training starts.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/data/idx.hpp"

namespace loom::data {

/// Which part of a data set: the training samples or the held-out test samples.
enum class split { train, test };

/// "train" or "test".
inline const char* to_string(split s) noexcept { return s == split::train ? "train" : "test"; }

/// A set of images held in memory: `size()` samples of `SampleShape::size` unsigned bytes each,
/// every one with a label in 0..Classes-1.
///
/// Requires: SampleShape is a loom::shape; 1 <= Classes <= 256.
template <class SampleShape, std::size_t Classes>
class labelled_images {
  static_assert(shape_type<SampleShape>, "labelled_images needs a loom::shape as sample shape");
  static_assert(Classes >= 1 && Classes <= 256, "labelled_images labels are bytes: 1..256 classes");

 public:
  using sample_shape = SampleShape;
  static constexpr std::size_t classes = Classes;

  /// Takes `pixels` (samples one after another, SampleShape::size bytes each) and one label
  /// per sample. `description` names the set in messages.
  ///
  /// Throws: loom::data_error when pixels.size() is not labels.size() * SampleShape::size or a
  /// label is >= Classes; the message starts with "loom: DESCRIPTION: ".
  labelled_images(std::vector<std::uint8_t> pixels, std::vector<std::uint8_t> labels,
                  std::string description = "in-memory images")
      : pixels_(std::move(pixels)),
        labels_(std::move(labels)),
        description_(std::move(description)) {
    const std::string where = "loom: " + description_ + ": ";
    if (pixels_.size() != labels_.size() * SampleShape::size) {
      throw data_error(where + "expected " + std::to_string(labels_.size()) + " labels x " +
                       std::to_string(SampleShape::size) + " bytes per sample of shape " +
                       loom::to_string<SampleShape>() + " = " +
                       std::to_string(labels_.size() * SampleShape::size) + " pixel bytes, found " +
                       std::to_string(pixels_.size()));
    }
    check_labels(labels_, where);
  }

  /// Loads a set from an IDX images file (unsigned bytes, count x extents...; the extents'
  /// product must be SampleShape::size, e.g. 28 x 28 for shape<1, 28, 28>) and an IDX labels
  /// file (unsigned bytes, one dimension), raw or gzip-compressed. `description` names the set
  /// in messages and description(); when empty it names both files.
  ///
  /// Throws: what loom::read_idx throws; loom::data_error when the image size does not match
  /// SampleShape, the counts differ, or a label is >= Classes, naming the files concerned.
  static labelled_images from_idx(const std::filesystem::path& images,
                                  const std::filesystem::path& labels,
                                  std::string description = {}) {
    idx_array img = detail::read_idx_ranked(images, 2, 255);
    std::size_t per_image = 1;
    std::string extents;
    for (std::size_t i = 1; i < img.dims.size(); ++i) {
      // Saturate: with a count of 0 the extents' product was never checked against memory.
      const std::size_t d = img.dims[i];
      per_image = (d != 0 && per_image > SIZE_MAX / d) ? SIZE_MAX : per_image * d;
      extents += (i > 1 ? " x " : "") + std::to_string(img.dims[i]);
    }
    if (per_image != SampleShape::size) {
      throw data_error("loom: images file " + images.string() + ": wrong image size: expected " +
                       std::to_string(SampleShape::size) + " bytes per image for sample shape " +
                       loom::to_string<SampleShape>() + ", found images of " + extents + " = " +
                       std::to_string(per_image) + " bytes");
    }
    idx_array lab = read_idx(labels, 1);
    if (img.dims[0] != lab.dims[0]) {
      throw data_error("loom: images file " + images.string() + " holds " +
                       std::to_string(img.dims[0]) + " images but labels file " + labels.string() +
                       " holds " + std::to_string(lab.dims[0]) + " labels: expected equal counts");
    }
    check_labels(lab.data, "loom: labels file " + labels.string() + ": ");
    if (description.empty()) {
      description = "images " + images.string() + ", labels " + labels.string();
    }
    return labelled_images(std::move(img.data), std::move(lab.data), std::move(description),
                           checked_tag{});
  }

  /// The number of samples.
  std::size_t size() const noexcept { return labels_.size(); }

  /// The SampleShape::size bytes of sample i, row-major. Requires: i < size().
  const std::uint8_t* pixels(std::size_t i) const noexcept {
    return pixels_.data() + i * SampleShape::size;
  }

  /// The label of sample i, in 0..Classes-1. Requires: i < size().
  std::uint8_t label(std::size_t i) const noexcept { return labels_[i]; }

  /// A copy holding samples 0..n-1.
  ///
  /// Throws: loom::invalid_argument when n > size().
  labelled_images first(std::size_t n) const {
    if (n > size()) {
      throw invalid_argument("loom: " + description_ + ": first(" + std::to_string(n) +
                             "): expected at most " + std::to_string(size()) +
                             " samples, the set holds " + std::to_string(size()));
    }
    std::vector<std::uint8_t> px(
        pixels_.begin(), pixels_.begin() + static_cast<std::ptrdiff_t>(n * SampleShape::size));
    std::vector<std::uint8_t> lb(labels_.begin(), labels_.begin() + static_cast<std::ptrdiff_t>(n));
    return labelled_images(std::move(px), std::move(lb),
                           description_ + " (first " + std::to_string(n) + ")", checked_tag{});
  }

  /// What the set is and where it came from, for messages and logs.
  const std::string& description() const noexcept { return description_; }

 private:
  struct checked_tag {};

  labelled_images(std::vector<std::uint8_t> pixels, std::vector<std::uint8_t> labels,
                  std::string description, checked_tag)
      : pixels_(std::move(pixels)),
        labels_(std::move(labels)),
        description_(std::move(description)) {}

  static void check_labels(const std::vector<std::uint8_t>& labels, const std::string& where) {
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] >= Classes) {
        throw data_error(where + "label " + std::to_string(labels[i]) + " at index " +
                         std::to_string(i) + " is out of range: expected 0.." +
                         std::to_string(Classes - 1));
      }
    }
  }

  std::vector<std::uint8_t> pixels_;
  std::vector<std::uint8_t> labels_;
  std::string description_;
};

/// Where Debian's dataset-fashion-mnist package puts the Fashion-MNIST files.
inline constexpr const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST and MNIST: 28 x 28 grey-scale images, 10 classes.
using fashion_mnist_set = labelled_images<shape<1, 28, 28>, 10>;

namespace detail {

/// DIR/NAME.gz if it exists, else DIR/NAME if it exists; otherwise throws loom::io_error
/// naming both paths tried and `hint`.
LOOM_DECL std::filesystem::path find_idx_file(const std::filesystem::path& dir,
                                              const std::string& name, const std::string& what,
                                              const std::string& hint);

/// Loads one split of a data set in the MNIST file layout from dir.
LOOM_DECL fashion_mnist_set load_mnist_layout(const std::filesystem::path& dir, split s,
                                              const std::string& set_name, const std::string& hint);

}  // namespace detail

/// Loads the train or test split of Fashion-MNIST from dir, which holds
/// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each either gzip-compressed with a ".gz"
/// suffix (preferred when both exist) or uncompressed. Train has 60000 samples, test 10000.
///
/// Throws: loom::io_error when a file is missing (naming both names tried and how to install
/// the data) or unreadable; loom::data_error when a file is malformed (see
/// labelled_images::from_idx).
LOOM_DECL fashion_mnist_set fashion_mnist(const std::filesystem::path& dir, split s);

/// fashion_mnist(default_fashion_mnist_dir, s).
LOOM_DECL fashion_mnist_set fashion_mnist(split s);

/// Loads the train or test split of MNIST (handwritten digits) from dir; same file names and
/// format as fashion_mnist.
///
/// Throws: as fashion_mnist.
LOOM_DECL fashion_mnist_set mnist(const std::filesystem::path& dir, split s);

}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/dataset.ipp"
#endif
