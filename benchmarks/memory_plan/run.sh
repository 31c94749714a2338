#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The memory plan of the example's mlp and cnn against one process's fit, each configuration in
# a fresh process: bash benchmarks/memory_plan/run.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
bin=$build/benchmarks/memory_plan/bench_memory_plan
[ -x "$bin" ] || { echo "run.sh: $bin not built (ninja -C $build bench_memory_plan)" >&2; exit 1; }
"$bin" mlp 64 | head -1
for model in mlp cnn; do
  for batch in 64 256 1024; do
    for opt in sgd adam; do "$bin" "$model" "$batch" "$opt" | tail -1; done
  done
done
