// SPDX-License-Identifier: Apache-2.0
#pragma once
// --export-onnx for the examples that train a whole model: the model as ONNX (loom::export_onnx),
// written by rank 0. (--load-weights and --save-weights are every example's: example.hpp.)

#include <iostream>

#include "example.hpp"
#include "loom/io.hpp"

namespace example {

/// After training, on rank 0: --export-onnx, if given.
template <class Model>
void write_onnx(const flags& f, const Model& model) {
  if (!f.export_onnx.empty()) {
    loom::export_onnx(model, f.export_onnx);
    if (!f.quiet) std::cerr << "wrote the ONNX model to " << f.export_onnx << "\n";
  }
}

}  // namespace example
