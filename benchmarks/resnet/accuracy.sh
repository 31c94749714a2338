#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Accuracy against PyTorch: the resnet example's ResNet-20 trained on Fashion-MNIST data-parallel
# on RANKS ranks (default 2) and its PyTorch twin (accuracy.py: DistributedDataParallel over gloo,
# the same number of processes) with the same recipe — SGD lr 0.02 momentum 0.9, global batch 64,
# cosine annealing over the run (--lr-schedule), EPOCHS epochs — from the same initial weights
# (PyTorch's initialisation of the twin under each seed, which loom loads with --load-weights);
# for each seed both test accuracies, then their means and the difference. Not a timed test: run
# it by hand (see benchmarks/README.md); about 50 s (loom) and 80 s (PyTorch eager) an epoch on
# 2 ranks of this machine.
#
#   accuracy.sh [--epochs 5] [--seeds 1,2,3] [--ranks 2] [--lr-schedule cosine|constant] [--sync-bn]
#
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (build parallelism, default 1),
# LOOM_DATA_VENV (default ~/.cache/loom/data-bench-venv, made by benchmarks/data/make_venv.sh when
# missing), FASHION_MNIST (default /usr/share/datasets/fashion-mnist).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, build, mpi_flags, field, cpu_line
source "$repo/benchmarks/common/lib.sh"

epochs=5 seeds=1,2,3 ranks=2 schedule=cosine sync=()
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) epochs=${2:?}; shift 2 ;;
    --seeds) seeds=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --lr-schedule) schedule=${2:?}; shift 2 ;;
    --sync-bn) sync=(--sync-bn); shift ;;
    -h|--help) sed -n '3,16p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -d "$data" ] || die "$data is missing (apt-get install dataset-fashion-mnist, or set FASHION_MNIST)"
venv=${LOOM_DATA_VENV:-$HOME/.cache/loom/data-bench-venv}
[ -x "$venv/bin/python" ] || bash "$repo/benchmarks/data/make_venv.sh" "$venv" >&2 || die "could not make $venv"
py="$venv/bin/python"
build resnet
program="$build_dir/examples/resnet/resnet"
[ -x "$program" ] || die "$program was not built (the examples need MPI: apt-get install libboost-mpi-dev openmpi-bin)"
mapfile -t mpi < <(mpi_flags "$ranks")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "accuracy: ResNet-20 on Fashion-MNIST, $ranks ranks x 1 thread, batch 64, SGD lr 0.02 momentum 0.9, $schedule schedule, $epochs epochs${sync:+, loom with --sync-bn}"
echo "  CPU: $(cpu_line); PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
loom_acc=() torch_acc=()
for seed in ${seeds//,/ }; do
  init="$work/init-$seed.safetensors"
  "${strip_env[@]}" "$py" "$here/accuracy.py" --write-init "$init" --seed "$seed"
  out=$("${strip_env[@]}" mpirun "${mpi[@]}" --bind-to none "$program" --model resnet20 --data "$data" \
        --load-weights "$init" --seed "$seed" --epochs "$epochs" --batch 64 --lr 0.02 --momentum 0.9 \
        --lr-schedule "$schedule" --threads 1 --quiet "${sync[@]}")
  line=$(grep '^result:' <<<"$out")
  a=$(field "$line" test_accuracy)
  t=$("${strip_env[@]}" "$py" "$here/accuracy.py" --data "$data" --init "$init" --seed "$seed" --epochs "$epochs" \
        --batch 64 --ranks "$ranks" --lr-schedule "$schedule" | grep '^result:')
  b=$(field "$t" test_accuracy)
  loom_acc+=("$a") torch_acc+=("$b")
  printf '  seed %s: loom %s (train loss %s, %s samples/s), PyTorch %s (train loss %s, %s s)\n' "$seed" "$a" \
    "$(field "$line" train_loss)" "$(field "$line" samples_per_s)" "$b" "$(field "$t" train_loss)" "$(field "$t" seconds)"
done
printf '%s\n' "${loom_acc[@]}" >"$work/l"
printf '%s\n' "${torch_acc[@]}" >"$work/t"
paste "$work/l" "$work/t" | awk '{ l += $1; t += $2; n++ } END {
  printf "  mean test accuracy over %d seed(s): loom %.4f, PyTorch %.4f, loom - PyTorch %+.2f points\n", n, l / n, t / n, 100 * (l - t) / n }'
