// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the monitoring tests: the fit options of their short runs, their small data set,
// a temporary directory and reading a file whole.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "loom/loom.hpp"

namespace loom_test {

/// One epoch of 64-sample batches without progress output.
inline loom::fit_options one_epoch() {
  loom::fit_options o;
  o.epochs = 1;
  o.batch = 64;
  o.progress = nullptr;
  return o;
}

/// The first 640 Fashion-MNIST training images: ten steps of 64.
inline const loom::data::fashion_mnist_set& small_set() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(640);
  return s;
}

/// A fresh directory under the system's temporary one, removed with everything in it.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("loom_monitor_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

/// The whole file (binary-safe).
inline std::string text_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace loom_test
