#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ResNet training throughput of loom against current PyTorch, single process: the CIFAR
# ResNet-20 on 1 x 28 x 28 and torchvision's ResNet-18 on 3 x 64 x 64, SGD (lr 0.02, momentum
# 0.9), batch 64, seeded random images; per (model, threads, math) row, loom
# (bench_resnet_throughput), PyTorch eager and torch.compile (throughput.py, in the venv of
# benchmarks/data/make_venv.sh) run alternately, round after round, so that noise hits all three;
# prints the medians of samples/s, loom/eager and loom/compile, the share of oneDNN's own rate on the
# network's convolutions that loom reaches (%ceiling), the CPU and the versions. bf16
# rows (loom's math_mode::bf16, PyTorch's CPU autocast) only where the CPU has avx512_bf16 or AMX.
# --conv picks loom's fp32 convolution algorithm (loom::conv_algorithm): auto (the default:
# Winograd where measured faster, direct elsewhere), direct (PyTorch's, everywhere) or winograd;
# PyTorch's stay direct; %ceiling is against oneDNN running the algorithms loom picks.
# Not a timed test: run it by hand (see benchmarks/README.md).
#
#   throughput.sh [--model resnet20,resnet18] [--threads 1,2] [--math fp32,bf16] [--rounds 3]
#                 [--seconds 3] [--warmup 1] [--conv auto|direct|winograd]
#
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (build parallelism, default 1),
# LOOM_DATA_VENV (the PyTorch venv, default ~/.cache/loom/data-bench-venv; made if missing),
# QUIET_WAIT (seconds to wait for an idle machine before each run, default 0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, quiet_wait, build, field, cpu_line, has_cpu_flag, median
source "$repo/benchmarks/common/lib.sh"

models=resnet20,resnet18 threads=1,2 maths=fp32,bf16 rounds=3 seconds=3 warmup=1 conv=auto
while [ $# -gt 0 ]; do
  case $1 in
    --model) models=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --math) maths=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --seconds) seconds=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --conv) conv=${2:?}; shift 2 ;;
    -h|--help) sed -n '3,21p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

build bench_resnet_throughput
program="$build_dir/benchmarks/resnet/bench_resnet_throughput"
venv=${LOOM_DATA_VENV:-$HOME/.cache/loom/data-bench-venv}
bash "$repo/benchmarks/data/make_venv.sh" "$venv" >/dev/null
log=$(mktemp)  # the programs' stderr (compile warnings, notes); shown on failure
fractions=$(mktemp)  # loom's ceiling_fraction of each run of the current row
trap 'rm -f "$log" "$fractions"' EXIT
versions=$("$venv/bin/python" -c 'import torch, torchvision
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")' 2>>"$log")
bf16=no
if has_cpu_flag avx512_bf16 || has_cpu_flag amx_bf16; then bf16=yes; fi

# samples/s of one run of implementation $1 (loom, eager, compile) on row $2 $3 $4 (model,
# threads, math).
run() {
  local impl=$1 model=$2 t=$3 math=$4 out line
  local common=(--model "$model" --threads "$t" --math "$math" --seconds "$seconds" --warmup "$warmup")
  quiet_wait
  if [ "$impl" = loom ]; then
    out=$("${strip_env[@]}" "$program" "${common[@]}" --conv "$conv" 2>>"$log") || { tail -n 20 "$log" >&2; die "$program failed"; }
  else
    out=$("${strip_env[@]}" "$venv/bin/python" "$here/throughput.py" --impl "$impl" "${common[@]}" 2>>"$log") ||
      { tail -n 20 "$log" >&2; die "throughput.py --impl $impl failed"; }
  fi
  line=$(grep '^row:' <<<"$out")
  [ "$impl" != loom ] || field "$line" ceiling_fraction >>"$fractions"
  field "$line" samples_per_s
}

echo "ResNet training throughput, loom against PyTorch: batch 64, SGD (lr 0.02, momentum 0.9), random images,"
echo "  one process; $rounds round(s) of loom, eager, torch.compile in turn per row, ${seconds} s timed each after ${warmup} s warm-up"
echo "  loom's fp32 convolutions: $conv (loom::conv_algorithm; PyTorch's are direct)"
echo "  CPU: $(cpu_line)"
echo "  $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
table=()
IFS=, read -r -a model_list <<<"$models"
IFS=, read -r -a thread_list <<<"$threads"
IFS=, read -r -a math_list <<<"$maths"
for model in "${model_list[@]}"; do
  for t in "${thread_list[@]}"; do
    for math in "${math_list[@]}"; do
      if [ "$math" = bf16 ] && [ $bf16 = no ]; then
        table+=("$(printf '%-9s %7s %-5s  skipped: this CPU has neither avx512_bf16 nor AMX' "$model" "$t" "$math")")
        continue
      fi
      declare -A got=([loom]="" [eager]="" [compile]="")
      : >"$fractions"
      order=(loom eager compile)
      for ((r = 1; r <= rounds; r++)); do
        for impl in "${order[@]}"; do got[$impl]+=" $(run "$impl" "$model" "$t" "$math")"; done
        printf '  %s %s thread(s) %s, round %d: loom%s, eager%s, compile%s samples/s\n' "$model" "$t" "$math" "$r" \
          "$(awk '{ print " " $NF }' <<<"${got[loom]}")" "$(awk '{ print " " $NF }' <<<"${got[eager]}")" \
          "$(awk '{ print " " $NF }' <<<"${got[compile]}")"
        order=("${order[@]:1}" "${order[0]}")  # rotate who goes first
      done
      # shellcheck disable=SC2086  # the values are words
      ml=$(median ${got[loom]}) me=$(median ${got[eager]}) mc=$(median ${got[compile]})
      # shellcheck disable=SC2046
      mf=$(median $(cat "$fractions"))
      table+=("$(awk -v m="$model" -v t="$t" -v x="$math" -v l="$ml" -v e="$me" -v c="$mc" -v f="$mf" \
        'BEGIN { printf "%-9s %7s %-5s %10.0f %10.0f %10.0f %11.2f %13.2f %9.0f%%", m, t, x, l, e, c, l / e, l / c, 100 * f }')")
      unset got
    done
  done
done
echo "  PyTorch: $versions (eager and torch.compile, default inductor backend; bf16 via torch.autocast(\"cpu\"))"
echo
printf '%-9s %7s %-5s %10s %10s %10s %11s %13s %10s\n' model threads math loom eager compile loom/eager loom/compile "%ceiling"
printf '%s\n' "${table[@]}"
echo "(medians of samples/s over $rounds rounds; ratios above 1: loom faster; %ceiling: loom's rate on the"
echo " network's convolutions over oneDNN's own on them, same batch, threads and math — see throughput.cpp)"
