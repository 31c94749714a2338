// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom's files: a network's weights as safetensors (loom::save_weights, loom::load_weights) and
// its ONNX export (loom::export_onnx). Host-only code, no library beyond the C++ standard one
// and POSIX.

#include "loom/io/onnx.hpp"
#include "loom/io/safetensors.hpp"
