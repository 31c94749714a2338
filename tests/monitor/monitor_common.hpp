// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the monitoring tests: the fit options of their short runs.

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

}  // namespace loom_test
