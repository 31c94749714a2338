#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Training from shards against training from memory: the resnet example (examples/resnet)
# data-parallel on RANKS ranks (default 2), its samples/s reading Fashion-MNIST's IDX files
# (memory-mapped, already decoded) and reading the same images as PNG tar shards (decoded by the
# loader's threads while the step runs), the two alternating round after round so that noise hits
# both; prints each round, the medians and their ratio, and the CPU. Not a timed test: run it by
# hand (see benchmarks/README.md).
#
#   end_to_end.sh [--model resnet20|resnet56|resnet18] [--ranks 2] [--rounds 5] [--steps 60]
#                 [--batch 64] [--threads N] [--decode-threads N]
#
# --threads: compute threads per rank (default: the cores over the ranks, at least 1; fewer
# leave cores to the loader's threads).
# The shards are written once by loom-shards into $LOOM_BUILD_DIR/data-bench-fm-shards (PNG,
# 5,000 samples a shard). --decode-threads is passed to the shard runs (default: the example's,
# the cores the compute pool leaves, at least 1). Needs dataset-fashion-mnist.
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (build parallelism, default 1),
# QUIET_WAIT (seconds to wait for an idle machine before each run, default 0), FASHION_MNIST
# (default /usr/share/datasets/fashion-mnist).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, quiet_wait, build, mpi_flags, field, median, cpu_line
source "$repo/benchmarks/common/lib.sh"

model=resnet20 ranks=2 rounds=5 steps=60 batch=64 decode=() threads=
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --decode-threads) decode=(--decode-threads "${2:?}"); shift 2 ;;
    -h|--help) sed -n '3,21p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

idx=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -d "$idx" ] || die "$idx is missing (apt-get install dataset-fashion-mnist, or set FASHION_MNIST)"
build resnet loom-shards
program="$build_dir/examples/resnet/resnet"
[ -x "$program" ] || die "$program was not built (the examples need MPI: apt-get install libboost-mpi-dev openmpi-bin)"
shards="$build_dir/data-bench-fm-shards"
if [ ! -f "$shards/train.shards.json" ] || [ ! -f "$shards/test.shards.json" ]; then
  rm -rf "$shards.tmp"
  "$build_dir/tools/loom-shards" --idx "$idx" --out "$shards.tmp" --samples-per-shard 5000 >/dev/null ||
    die "loom-shards could not convert $idx"
  rm -rf "$shards" && mv "$shards.tmp" "$shards"
fi
mapfile -t mpi < <(mpi_flags "$ranks")
[ -n "$threads" ] || threads=$(( $(nproc) / ranks )); [ "$threads" -ge 1 ] || threads=1

# samples/s of one run reading $1 (IDX or shards).
run() {
  quiet_wait
  local out extra=()
  [ "$1" = "$shards" ] && extra=("${decode[@]}")
  out=$("${strip_env[@]}" mpirun "${mpi[@]}" --bind-to none "$program" --model "$model" --batch "$batch" \
        --data "$1" --max-steps "$steps" --threads "$threads" --quiet "${extra[@]}")
  field "$(grep '^result:' <<<"$out")" samples_per_s
}

echo "training from shards: $model, $ranks ranks x $threads thread(s), batch $batch, $steps steps, $rounds rounds"
echo "  CPU: $(cpu_line)"
echo "  memory: $idx (IDX, memory-mapped); shards: $shards (PNG)"
memory=() sharded=()
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then a=$(run "$idx"); b=$(run "$shards"); else b=$(run "$shards"); a=$(run "$idx"); fi
  memory+=("$a") sharded+=("$b")
  printf '  round %d: from memory %s, from shards %s samples/s\n' "$r" "$a" "$b"
done
mm=$(median "${memory[@]}") ms=$(median "${sharded[@]}")
awk -v m="$mm" -v s="$ms" 'BEGIN { printf "  median: from memory %.0f, from shards %.0f samples/s: %.3f (%.1f%% slower)\n", m, s, s / m, 100 * (1 - s / m) }'
