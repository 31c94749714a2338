// SPDX-License-Identifier: Apache-2.0
#pragma once
// --load-weights, --save-weights and --export-onnx for the examples that train a whole model:
// the weights as safetensors (loom::load_weights, loom::save_weights) and the model as ONNX
// (loom::export_onnx). Every rank loads the same file; rank 0 writes.

#include <iostream>

#include "example.hpp"
#include "loom/io.hpp"

namespace example {

/// Before training: the weights of --load-weights, if given, into model (a loom::model).
template <class Model>
void load_weights(const flags& f, Model& model) {
  if (f.load_weights.empty()) return;
  loom::load_weights(model, f.load_weights);
  if (!f.quiet) std::cerr << "loaded the weights of " << f.load_weights << "\n";
}

/// After training, on rank 0: --save-weights and --export-onnx, if given.
template <class Model>
void write_weights(const flags& f, const Model& model) {
  if (!f.save_weights.empty()) {
    loom::save_weights(model, f.save_weights);
    if (!f.quiet) std::cerr << "wrote the weights to " << f.save_weights << "\n";
  }
  if (!f.export_onnx.empty()) {
    loom::export_onnx(model, f.export_onnx);
    if (!f.quiet) std::cerr << "wrote the ONNX model to " << f.export_onnx << "\n";
  }
}

}  // namespace example
