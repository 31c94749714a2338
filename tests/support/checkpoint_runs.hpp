// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the tests of runs that stop and resume from checkpoints share: a fresh directory for a
// test's checkpoints, and the fit options of a short run with checkpoints every so many steps
// (none at the end, no signal handlers), so that the tests choose exactly where runs stop.

#include <cstddef>
#include <filesystem>
#include <string>

#include "loom/train/fit_options.hpp"

namespace loom_test {

/// `prefix` + `name` in the temporary directory, emptied.
inline std::filesystem::path fresh_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + name);
  std::filesystem::remove_all(d);
  return d;
}

/// Up to 10 epochs of batch `batch`, stopping after max_steps steps, with a checkpoint in `dir`
/// every `every` steps (no directory: none); quiet.
inline loom::fit_options checkpointed_fit(std::size_t max_steps, std::size_t batch, const std::filesystem::path& dir = {},
                                          std::size_t every = 0) {
  loom::fit_options o;
  o.epochs = 10;
  o.max_steps = max_steps;
  o.batch = batch;
  o.progress = nullptr;
  o.checkpoint.directory = dir.string();
  o.checkpoint.every_steps = every;
  o.checkpoint.at_end = false;
  o.checkpoint.on_signal = false;
  return o;
}

}  // namespace loom_test
