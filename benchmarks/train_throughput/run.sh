#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# loom against PyTorch on the same training work. Modes:
#   run.sh [throughput] [--model mlp,cnn] [--batch 64,256] [--threads 1,2] [--math fp32,bf16]
#          [--seconds 2] [--repeats 3]
#       builds bench_train_throughput if needed, then for each (model, batch, threads, math) row runs
#       loom, PyTorch as installed and PyTorch tuned one after the other (alternating the order
#       from row to row, so that noise hits all three) and prints one table. --math bf16 rows:
#       loom with trainer_options::math = bf16, PyTorch with CPU autocast to bfloat16 (default
#       --math fp32).
#   run.sh accuracy       full training runs (SGD lr 0.02 momentum 0.9, batch 64, seed 1): mlp
#                         10 epochs, cnn 5 epochs, loom (examples/fashion_mnist) and PyTorch;
#                         prints both test accuracies. Takes a while (the cnn epochs).
#   run.sh table FILE     the table again from the raw lines of an earlier run.
#   run.sh compile-time   seconds to compile examples/fashion_mnist/main.cpp with g++ -O2 on
#                         one core.
# Environment: LOOM_BUILD_DIR (default build/; if configuring or building there fails,
# build-bench/ with LOOM_BUILD_TESTS=OFF), LOOM_JOBS (default 1), TORCH_PYTHON (default
# /usr/bin/python3, Debian's python3-torch), RESULTS (file the raw lines go to), ACC_THREADS
# (threads of the accuracy runs, default 1: robust on a shared machine), TUNED_BLAS_THREADS
# (OPENBLAS_NUM_THREADS of the tuned PyTorch, default 1: more makes OpenBLAS's threads fight
# PyTorch's OpenMP threads for the cores, measured 3x slower at 2 threads), LOOM_ENV
# (variables for the loom process only, for experiments; empty by default).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${TORCH_PYTHON:-/usr/bin/python3}
peer="$here/torch_peer.py"
jobs=${LOOM_JOBS:-1}

# Variables that tune BLAS / OpenMP. loom runs without any of them; PyTorch "as installed" too.

# strip_env, die, quiet_wait, build, mpi_flags, field
source "$repo/benchmarks/common/lib.sh"

check_torch() {
  [ -x "$py" ] || die "$py not found (Debian's python3-torch runs on /usr/bin/python3)"
  "$py" -c 'import torch' 2>/dev/null ||
    die "$py cannot import torch: apt-get install python3-torch (and libopenblas0-pthread, which libtorch recommends)"
}

# The table from the raw `row:` lines in file $1.
table() {
  awk -v cores="$(nproc)" '
    function get(line, key,   n, i, kv, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function ratio(x, y) { return (x != "" && y != "" && y + 0 > 0) ? sprintf("%.2f", x / y) : "-" }
    /^row:/ {
      m = get($0, "math"); if (m == "") m = "fp32"
      k = get($0, "model") " " get($0, "batch") " " get($0, "threads") " " m
      if (!(k in seen)) { seen[k] = 1; order[++rows] = k }
      impl = get($0, "impl"); v = get($0, "variant"); o = get($0, "others_cores")
      if (o != "" && (!(k in busy) || o + 0 > busy[k] + 0)) busy[k] = o
      if (impl == "loom") {
        loom[k] = get($0, "samples_per_s"); gf[k] = get($0, "gflops"); ceil[k] = get($0, "ceiling_gflops")
        cpuf[k] = get($0, "cpu_ceiling_fraction")
      } else if (v == "installed") inst[k] = get($0, "samples_per_s")
      else if (v == "tuned") tuned[k] = get($0, "samples_per_s")
    }
    END {
      printf "%-5s %5s %7s %4s %10s %12s %11s %10s %9s %7s %8s %6s %5s %6s\n", "model", "batch", "threads", "math", "loom", \
        "torch-inst", "torch-tuned", "loom/tuned", "loom/inst", "GFLOP/s", "ceiling", "%ceil", "%cpu", "others "
      for (r = 1; r <= rows; r++) {
        k = order[r]; split(k, p, " ")
        printf "%-5s %5s %7s %4s %10s %12s %11s %10s %9s %7s %8s %6s %5s %6s\n", p[1], p[2], p[3], p[4], \
          (k in loom) ? loom[k] : "-", (k in inst) ? inst[k] : "-", (k in tuned) ? tuned[k] : "-", \
          ratio(loom[k], tuned[k]), ratio(loom[k], inst[k]), (k in gf) ? gf[k] : "-", \
          (k in ceil) ? ceil[k] : "-", (k in ceil && ceil[k] > 0) ? sprintf("%.0f%%", 100 * gf[k] / ceil[k]) : "-", \
          (cpuf[k] != "" && cpuf[k] > 0) ? sprintf("%.0f%%", 100 * cpuf[k]) : "-", \
          (k in busy) ? busy[k] (busy[k] > cores - p[3] + 0.25 ? "*" : " ") : "-"
        if (k in busy && busy[k] > cores - p[3] + 0.25) marked = 1
        if (p[2] == 64 && p[3] == 1 && p[4] == "fp32" && (k in loom) && (k in tuned))
          target = target sprintf("  %s batch 64, 1 thread: loom/tuned %.2f %s\n", p[1], loom[k] / tuned[k], \
                                  loom[k] / tuned[k] >= 1.5 ? "(meets >= 1.5)" : "(misses >= 1.5)")
      }
      if (marked) printf "* other processes kept more than %s - threads cores busy: the row did not have its cores to itself\n", cores
      if (target != "") printf "\ntarget (loom >= 1.5x tuned PyTorch at batch 64, 1 thread):\n%s", target
    }' "$1"
}

throughput() {
  local models=mlp,cnn batches=64,256 threads=1,2 maths=fp32 seconds=2 repeats=3
  while [ $# -gt 0 ]; do
    case $1 in
      --model) models=$2; shift 2 ;;
      --batch) batches=$2; shift 2 ;;
      --threads) threads=$2; shift 2 ;;
      --math) maths=$2; shift 2 ;;
      --seconds) seconds=$2; shift 2 ;;
      --repeats) repeats=$2; shift 2 ;;
      --quick) seconds=1; shift ;;
      *) die "unknown flag $1 (see the top of $0)" ;;
    esac
  done
  check_torch
  build bench_train_throughput
  local bench="$build_dir/benchmarks/train_throughput/bench_train_throughput"
  local results=${RESULTS:-$build_dir/train_throughput.txt}
  : >"$results"
  : >"$results.stderr"
  local common=(--seconds "$seconds" --repeats "$repeats")
  local started=$SECONDS row=0

  # LOOM_ENV: extra variables for the loom process only, for experiments (e.g.
  # LOOM_ENV=OMP_WAIT_POLICY=passive); empty by default, and the table says when it is not.
  local loom_env=()
  [ -z "${LOOM_ENV:-}" ] || read -r -a loom_env <<<"$LOOM_ENV"
  run_loom() {
    "${strip_env[@]}" "${loom_env[@]}" "$bench" --model "$1" --batch "$2" --threads "$3" --math "$4" "${common[@]}" \
      2>>"$results.stderr" | tee -a "$results" >&2
  }
  run_installed() {
    "${strip_env[@]}" "$py" "$peer" --variant installed --model "$1" --batch "$2" --threads "$3" --math "$4" "${common[@]}" \
      2>>"$results.stderr" | tee -a "$results" >&2
  }
  tuned_blas_env "$py" "${TUNED_BLAS_THREADS:-1}"
  run_tuned() {
    "${tuned_env[@]}" "$py" "$peer" --variant tuned --flush-denormal --model "$1" --batch "$2" --threads "$3" --math "$4" "${common[@]}" \
      2>>"$results.stderr" | tee -a "$results" >&2
  }

  local m b t x
  for m in ${models//,/ }; do
    for b in ${batches//,/ }; do
      for t in ${threads//,/ }; do
        for x in ${maths//,/ }; do
          echo "run.sh: $m batch $b, $t thread(s), $x [$((SECONDS - started)) s]" >&2
          if [ $((row % 2)) = 0 ]; then
            run_loom "$m" "$b" "$t" "$x"; run_installed "$m" "$b" "$t" "$x"; run_tuned "$m" "$b" "$t" "$x"
          else
            run_tuned "$m" "$b" "$t" "$x"; run_installed "$m" "$b" "$t" "$x"; run_loom "$m" "$b" "$t" "$x"
          fi
          row=$((row + 1))
        done
      done
    done
  done

  local first_tuned first_installed
  first_installed=$(grep -m1 '^row: impl=torch variant=installed' "$results" || true)
  first_tuned=$(grep -m1 '^row: impl=torch variant=tuned' "$results" || true)
  echo
  echo "Training throughput, samples/s (median of $repeats runs of ~${seconds} s after a warm-up; $(nproc) cores:"
  echo "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - started)) s"
  if [ -z "${LOOM_ENV:-}" ]; then
    echo "  loom:            no BLAS/OpenMP tuning variables (env: $(field "$(grep -m1 '^row: impl=loom' "$results")" env))"
  else
    echo "  loom:            NOT plain: LOOM_ENV=$LOOM_ENV (env: $(field "$(grep -m1 '^row: impl=loom' "$results")" env))"
  fi
  echo "  torch installed: env $(field "$first_installed" env) (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset);" \
    "blas $(field "$first_installed" blas), core $(field "$first_installed" blas_core)," \
    "$(field "$first_installed" blas_threads) BLAS threads (OpenBLAS ignores torch.set_num_threads)"
  echo "  torch tuned:     env $(tuned_blas_words) OPENBLAS_NUM_THREADS=${TUNED_BLAS_THREADS:-1}," \
    "torch.set_flush_denormal(True); blas core $(field "$first_tuned" blas_core)"
  cpu_header "$results"
  echo "  ceiling, measured in the loom process before the rows on the row's thread count: mlp rows oneDNN sgemm"
  echo "  256x784x256, cnn rows oneDNN's own convolutions of the cnn at the row's batch (forward, backward data and"
  echo "  weights, in oneDNN's preferred layouts); %ceil = loom GFLOP/s / ceiling, %cpu = the same per CPU second of"
  echo "  each (what a busy machine does not dilute at 1 thread)"
  echo "  (mlp 1.007 MFLOP, cnn 24.995 MFLOP per sample and step). Rows with 2 threads share the 2 cores with"
  echo "  everything else on the machine: they are noisy. 'others' = CPU cores other processes kept busy during"
  echo "  the timed runs (the most of the three programs'); a row marked * had fewer free cores than threads."
  echo
  table "$results"
  echo
  echo "raw lines: $results"
}

accuracy() {
  local t=${ACC_THREADS:-1}
  check_torch
  build fashion_mnist
  local fm="$build_dir/examples/fashion_mnist/fashion_mnist"
  local common=(--batch 64 --lr 0.02 --momentum 0.9 --seed 1 --threads "$t" --quiet)
  local lm lc tm tc started=$SECONDS
  echo "run.sh: accuracy runs, $t thread(s): loom mlp, loom cnn, torch mlp, torch cnn" >&2
  lm=$("${strip_env[@]}" "$fm" --model mlp --epochs 10 "${common[@]}" | grep '^result:')
  echo "loom  $lm [$((SECONDS - started)) s]" >&2
  lc=$("${strip_env[@]}" "$fm" --model cnn --epochs 5 "${common[@]}" | grep '^result:')
  echo "loom  $lc [$((SECONDS - started)) s]" >&2
  tuned_blas_env "$py" "${TUNED_BLAS_THREADS:-1}"
  local tm_out
  tm_out=$("${tuned_env[@]}" "$py" "$peer" --accuracy --model mlp --epochs 10 --batch 64 --seed 1 --threads "$t" \
           --flush-denormal --variant tuned --quiet)
  tm=$(grep '^result:' <<<"$tm_out")
  echo "torch $tm [$((SECONDS - started)) s]" >&2
  tc=$("${tuned_env[@]}" "$py" "$peer" --accuracy --model cnn --epochs 5 --batch 64 --seed 1 --threads "$t" \
       --flush-denormal --variant tuned --quiet | grep '^result:')
  echo "torch $tc [$((SECONDS - started)) s]" >&2
  echo
  echo "Test accuracy on Fashion-MNIST (10,000 test images), SGD lr 0.02 momentum 0.9, batch 64, seed 1, $t thread(s):"
  printf '%-5s %6s %10s %12s %12s %12s %14s\n' model epochs loom "loom target" pytorch "torch samp/s" "loom samp/s"
  printf '%-5s %6s %10s %12s %12s %12s %14s\n' mlp 10 "$(field "$lm" test_accuracy)" ">= 0.875" \
    "$(field "$tm" test_accuracy)" "$(field "$tm" samples_per_s)" "$(field "$lm" samples_per_s)"
  printf '%-5s %6s %10s %12s %12s %12s %14s\n' cnn 5 "$(field "$lc" test_accuracy)" ">= 0.900" \
    "$(field "$tc" test_accuracy)" "$(field "$tc" samples_per_s)" "$(field "$lc" samples_per_s)"
  awk -v m="$(field "$lm" test_accuracy)" -v c="$(field "$lc" test_accuracy)" 'BEGIN {
    printf "loom mlp %s the target, loom cnn %s the target\n", (m >= 0.875 ? "meets" : "misses"), (c >= 0.900 ? "meets" : "misses") }'
  echo "(PyTorch ran tuned: $(tuned_blas_words) OPENBLAS_NUM_THREADS=${TUNED_BLAS_THREADS:-1}, flush-denormal;" \
    "its shuffling differs from loom's)"
  echo "CPU (loom):            $(cpu_line) (/proc/cpuinfo)"
  echo "CPU (torch tuned):     $(sed -n 's/^cpu: impl=torch variant=tuned //p' <<<"$tm_out" | head -n1)"
}

compile_time() {
  local cxx=${CXX:-g++} obj
  obj=$(mktemp --suffix=.o)
  local cmd=("$cxx" -std=c++20 -O2 -fopenmp -I"$repo/include" -c "$repo/examples/fashion_mnist/main.cpp" -o "$obj")
  # One g++ process is one core's work. It is not pinned: on a shared machine pinning can put
  # it on the busier core. CPU time (user + sys) does not count time spent waiting for a core.
  echo "run.sh: ${cmd[*]}" >&2
  local best_wall="" best_cpu="" i out
  for i in 1 2; do
    out=$( { /usr/bin/time -f '%e %U %S' "${cmd[@]}"; } 2>&1 >/dev/null | tail -n1)
    read -r wall user sys <<<"$out"
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')
    echo "run.sh: run $i: ${wall} s wall, ${cpu} s CPU" >&2
    if [ -z "$best_wall" ] || awk -v a="$wall" -v b="$best_wall" 'BEGIN { exit !(a < b) }'; then best_wall=$wall; fi
    if [ -z "$best_cpu" ] || awk -v a="$cpu" -v b="$best_cpu" 'BEGIN { exit !(a < b) }'; then best_cpu=$cpu; fi
  done
  rm -f "$obj"
  echo "compile-time: file=examples/fashion_mnist/main.cpp compiler=$($cxx -dumpfullversion) flags=-O2" \
    "wall_s=$best_wall cpu_s=$best_cpu target_s=20" \
    "verdict=$(awk -v c="$best_cpu" 'BEGIN { print (c <= 20 ? "meets" : "misses") }')" \
    "(best of 2 runs; the verdict is on CPU time, which waiting for a busy core does not inflate)"
}

mode=throughput
case ${1:-} in
  throughput | accuracy | compile-time) mode=$1; shift ;;
  table) [ -f "${2:-}" ] || die "usage: run.sh table RAW-LINES-FILE"; table "$2"; exit 0 ;;
  -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
case $mode in
  throughput) throughput "$@" ;;
  accuracy) accuracy "$@" ;;
  compile-time) compile_time "$@" ;;
esac
