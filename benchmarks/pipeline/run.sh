#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Pipeline schedules: builds bench_pipeline if needed and runs it on 2 ranks (one stage each,
# 1 thread per rank): GPipe against 1F1B at M = 1, 2, 4, 8 micro-batches on a network of four
# 1024-wide layers, equal work per stage and pass, global batch 256 — samples/s, the measured bubble
# beside the theory (S-1)/(M+S-1), and peak activation bytes per stage. See benchmarks/README.md.
#   run.sh [--steps N] [--repeats R] [--batch B]
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (default 2), QUIET_WAIT (seconds to
# wait for an idle machine first, default 0), MPIRUN_FLAGS (extra mpirun flags).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-2}
# strip_env, die, quiet_wait, build, mpi_flags, field
source "$repo/benchmarks/common/lib.sh"

command -v mpirun >/dev/null || die "mpirun not found: apt-get install openmpi-bin libopenmpi-dev libboost-mpi-dev"
build bench_pipeline
quiet_wait
mapfile -t flags < <(mpi_flags 2)
# shellcheck disable=SC2086
exec "${strip_env[@]}" OMP_NUM_THREADS=1 mpirun "${flags[@]}" ${MPIRUN_FLAGS:-} "$build_dir/benchmarks/pipeline/bench_pipeline" "$@"
