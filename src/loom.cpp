// SPDX-License-Identifier: Apache-2.0
// The library's one source file, for separate compilation (the CMake target loom::compiled; see
// loom/core/config.hpp and README.md): defines LOOM_SOURCE and includes the headers whose
// non-template functions are declared there and defined in their impl/*.ipp, so that those
// definitions are compiled here once, not inline in every translation unit that uses them; and
// the instantiations for loom's own types that the headers name with LOOM_INSTANTIATE.
// Nothing here depends on MPI or CUDA (the fit loop comes with the trainer's header, which
// includes the CPU backend's; the MPI part is src/loom_mpi.cpp).
#ifndef LOOM_SEPARATE_COMPILATION
#define LOOM_SEPARATE_COMPILATION
#endif
#define LOOM_SOURCE

// Every header with an impl/*.ipp or LOOM_INSTANTIATE lines (the ones it includes come with
// them; listed all the same).
#include "loom/backend/cpu/batch_norm.hpp"
#include "loom/backend/cpu/conv2d.hpp"
#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/backend/cpu/features.hpp"
#include "loom/backend/cpu/gemm.hpp"
#include "loom/backend/cpu/pool2d.hpp"
#include "loom/backend/cpu/runtime.hpp"
#include "loom/core/half.hpp"
#include "loom/core/type_name.hpp"
#include "loom/data/cache.hpp"
#include "loom/data/dataset.hpp"
#include "loom/data/idx.hpp"
#include "loom/data/mapped.hpp"
#include "loom/data/shard_loader.hpp"
#include "loom/data/shard_schedule.hpp"
#include "loom/data/shards.hpp"
#include "loom/data/tar.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/io/file.hpp"
#include "loom/io/json.hpp"
#include "loom/io/layer_description.hpp"
#include "loom/io/onnx.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/live.hpp"
#include "loom/monitor/metrics.hpp"
#include "loom/monitor/sampler.hpp"
#include "loom/monitor/tensorboard.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/residual_with.hpp"
#include "loom/optim/validate.hpp"
#include "loom/parallel/data/chunk_tree.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/data/data_parallel.hpp"
#include "loom/train/recovery.hpp"
#include "loom/train/trainer.hpp"
