#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What synchronized batch norm costs: the resnet example (examples/resnet) data-parallel on
# RANKS ranks (default 2), its samples/s without and with --sync-bn on the same work, the two
# alternating round after round so that noise hits both; prints each round, the medians and
# their ratio, and the CPU. Not a timed test: run it by hand (see benchmarks/README.md).
#
#   run.sh [--model resnet20|resnet56|resnet18] [--ranks 2] [--rounds 5] [--steps 60] [--batch 64]
#
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (build parallelism, default 1),
# QUIET_WAIT (seconds to wait for an idle machine before each run, default 0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, quiet_wait, build, mpi_flags, field, median, cpu_line
source "$repo/benchmarks/common/lib.sh"

model=resnet20 ranks=2 rounds=5 steps=60 batch=64
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    -h|--help) sed -n '3,12p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

build resnet
program="$build_dir/examples/resnet/resnet"
[ -x "$program" ] || die "$program was not built (the examples need MPI: apt-get install libboost-mpi-dev openmpi-bin)"
mapfile -t mpi < <(mpi_flags "$ranks")
threads=$(( $(nproc) / ranks )); [ "$threads" -ge 1 ] || threads=1

# samples/s of one run ("" or --sync-bn).
run() {
  quiet_wait
  local out
  out=$("${strip_env[@]}" mpirun "${mpi[@]}" --bind-to none "$program" --model "$model" --batch "$batch" \
        --max-steps "$steps" --train-samples $((steps * batch)) --test-samples 100 --threads "$threads" --quiet "$@")
  field "$(grep '^result:' <<<"$out")" samples_per_s
}

echo "synchronized batch norm: $model, $ranks ranks x $threads thread(s), batch $batch, $steps steps, $rounds rounds"
echo "  CPU: $(cpu_line)"
plain=() synced=()
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then a=$(run); b=$(run --sync-bn); else b=$(run --sync-bn); a=$(run); fi
  plain+=("$a") synced+=("$b")
  printf '  round %d: without %s, with --sync-bn %s samples/s\n' "$r" "$a" "$b"
done
mp=$(median "${plain[@]}") ms=$(median "${synced[@]}")
awk -v p="$mp" -v s="$ms" 'BEGIN { printf "  median: without %.0f, with --sync-bn %.0f samples/s: %.3f (%.1f%% slower)\n", p, s, s / p, 100 * (1 - s / p) }'
