// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of dataset.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/data/dataset.hpp"

namespace loom::data {
namespace detail {

LOOM_DECL std::filesystem::path find_idx_file(const std::filesystem::path& dir,
                                              const std::string& name, const std::string& what,
                                              const std::string& hint) {
  const std::filesystem::path gz = dir / (name + ".gz");
  const std::filesystem::path raw = dir / name;
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  if (std::filesystem::exists(raw, ec)) return raw;
  throw io_error("loom: " + what + " not found: tried " + gz.string() + " and " + raw.string() +
                 "; " + hint);
}

LOOM_DECL fashion_mnist_set load_mnist_layout(const std::filesystem::path& dir, split s,
                                              const std::string& set_name, const std::string& hint) {
  const std::string prefix = s == split::train ? "train" : "t10k";
  const std::string what = set_name + " " + to_string(s);
  const std::filesystem::path images =
      find_idx_file(dir, prefix + "-images-idx3-ubyte", what + " images", hint);
  const std::filesystem::path labels =
      find_idx_file(dir, prefix + "-labels-idx1-ubyte", what + " labels", hint);
  return fashion_mnist_set::from_idx(
      images, labels, what + " split (" + images.string() + ", " + labels.string() + ")");
}
}  // namespace detail
}  // namespace loom::data

namespace loom::data {

LOOM_DECL fashion_mnist_set fashion_mnist(const std::filesystem::path& dir, split s) {
  return detail::load_mnist_layout(
      dir, s, "Fashion-MNIST",
      "install the data set with `apt-get install dataset-fashion-mnist`, or point to a "
      "directory holding it with --data DIR");
}

LOOM_DECL fashion_mnist_set fashion_mnist(split s) {
  return fashion_mnist(default_fashion_mnist_dir, s);
}

LOOM_DECL fashion_mnist_set mnist(const std::filesystem::path& dir, split s) {
  return detail::load_mnist_layout(
      dir, s, "MNIST", "point to a directory holding the MNIST IDX files with --data DIR");
}
}  // namespace loom::data
