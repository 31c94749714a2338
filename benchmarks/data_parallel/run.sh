#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Data-parallel training throughput: loom (trainer + data_parallel<mpi_comm>, mpirun -np 1 and
# -np 2, 1 thread per rank) against PyTorch DistributedDataParallel (gloo, 2 processes x 1
# thread, tuned OpenBLAS) on the example's mlp and cnn. Modes:
#   run.sh [--model mlp,cnn] [--batch 64,128] [--seconds 2] [--repeats 5] [--torch-1]
#          [--deterministic-chunk C]
#       builds bench_data_parallel if needed, then for each (model, global batch) row runs loom
#       on 1 rank, loom on 2 ranks and PyTorch DDP on 2 processes one after the other (the
#       order reversed every other row, so that noise hits all alike) and prints one table and
#       the per-rank figures. --torch-1 also runs PyTorch DDP on 1 process (its own scaling).
#       --deterministic-chunk C runs loom in split-invariant mode (fit_options::
#       deterministic_chunk = C; docs/data-parallel.md), PyTorch as always.
#   run.sh table FILE     the tables again from the raw lines of an earlier run.
# Environment: LOOM_BUILD_DIR (default build/; if configuring or building there fails,
# build-bench/ with LOOM_BUILD_TESTS=OFF), LOOM_JOBS (default 2), TORCH_PYTHON (default
# /usr/bin/python3, Debian's python3-torch), RESULTS (file the raw lines go to), THREADS
# (threads per rank / process, default 1), MPIRUN_FLAGS (extra mpirun flags for loom, e.g.
# "--bind-to none" or "--mca coll_libnbc_iallreduce_algorithm 1"), QUIET_WAIT (seconds to wait
# for an idle machine before each run, default 0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${TORCH_PYTHON:-/usr/bin/python3}
peer="$here/torch_ddp.py"
jobs=${LOOM_JOBS:-2}
threads=${THREADS:-1}


# strip_env, die, quiet_wait, build, mpi_flags, field
source "$repo/benchmarks/common/lib.sh"

check_torch() {
  [ -x "$py" ] || die "$py not found (Debian's python3-torch runs on /usr/bin/python3)"
  "$py" -c 'import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null ||
    die "$py cannot import torch with torch.distributed (gloo): apt-get install python3-torch libopenblas0-pthread"
}

# The tables from the raw `row:` / `rank:` lines in file $1.
table() {
  awk '
    function get(line, key,   n, i, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function num(x) { return x == "" ? "-" : x }
    /^row:/ {
      k = get($0, "model") " " get($0, "batch")
      if (!(k in seen)) { seen[k] = 1; order[++rows] = k }
      impl = get($0, "impl"); o = get($0, "others_cores")
      if (o != "" && (!(k in busy) || o + 0 > busy[k] + 0)) busy[k] = o
      if (impl == "loom") {
        n = get($0, "ranks"); loom[k, n] = get($0, "samples_per_s")
        if (n == 2) { exposed[k] = get($0, "exposed_s"); fit[k] = get($0, "fit_s") }
      } else if (impl == "torch-ddp") torch[k, get($0, "procs")] = get($0, "samples_per_s")
    }
    /^rank:/ && get($0, "ranks") + 0 == 2 {
      k = get($0, "model") " " get($0, "batch")
      per[++nper] = sprintf("%-5s %5s %4s %9s %7s %9s %7s %7s %8s %10s", get($0, "model"), get($0, "batch"), get($0, "rank"), \
        get($0, "compute_s"), get($0, "comm_s"), get($0, "exposed_s"), get($0, "wait_s"), get($0, "data_s"), get($0, "fit_s"), \
        get($0, "samples_per_s"))
    }
    END {
      t1 = 0; for (i = 1; i <= rows; i++) if ((order[i], 1) in torch) t1 = 1
      printf "%-5s %6s %11s %12s %10s %9s %13s %11s %10s", "model", "global", "loom", "loom", "efficiency", "same", "torch DDP", \
        "loom/torch", "exposed"
      if (t1) printf " %11s %10s", "torch DDP", "torch"
      printf " %7s\n", "others"
      printf "%-5s %6s %11s %12s %10s %9s %13s %11s %10s", "", "batch", "1 rank", "2 ranks", "", "per rank", "2 procs", "", "comm %"
      if (t1) printf " %11s %10s", "1 proc", "efficiency"
      printf " %7s\n", "cores"
      for (i = 1; i <= rows; i++) {
        k = order[i]; split(k, p, " ")
        l1 = loom[k, 1]; l2 = loom[k, 2]; tt = torch[k, 2]
        eff = (l1 != "" && l2 != "" && l1 + 0 > 0) ? sprintf("%.2f", l2 / (2 * l1)) : "-"
        h = p[1] " " (p[2] / 2); lh = ((h, 1) in loom) ? loom[h, 1] : ""
        same = (lh != "" && l2 != "" && lh + 0 > 0) ? sprintf("%.2f", l2 / (2 * lh)) : "-"
        rat = (l2 != "" && tt != "" && tt + 0 > 0) ? sprintf("%.2f", l2 / tt) : "-"
        ex = ((k in fit) && fit[k] + 0 > 0) ? sprintf("%.0f%%", 100 * exposed[k] / fit[k]) : "-"
        printf "%-5s %6s %11s %12s %10s %9s %13s %11s %10s", p[1], p[2], num(l1), num(l2), eff, same, num(tt), rat, ex
        if (t1) {
          u = torch[k, 1]
          printf " %11s %10s", num(u), (u != "" && tt != "" && u + 0 > 0) ? sprintf("%.2f", tt / (2 * u)) : "-"
        }
        printf " %6s%s\n", (k in busy) ? busy[k] : "-", (busy[k] + 0 > 0.25) ? "*" : " "
        if (busy[k] + 0 > 0.25) marked = 1
        if (p[1] == "cnn" && p[2] == 128 && eff != "-")
          target = target sprintf("  cnn, global batch 128: scaling efficiency %s %s\n", eff, (eff + 0 >= 0.90) ? "(meets >= 0.90)" : "(misses >= 0.90)")
        if (rat != "") {
          want = (p[1] == "mlp") ? 2.0 : 1.5
          target = target sprintf("  %s, global batch %s: loom/torch DDP %s %s\n", p[1], p[2], rat, \
            (rat != "-" && rat + 0 >= want) ? sprintf("(meets >= %.1f)", want) : sprintf("(misses >= %.1f)", want))
        }
      }
      if (marked) print "* other processes kept more than 0.25 cores busy during the row: its figures are noisy"
      if (target != "") printf "\ntargets:\n%s", target
      if (nper) {
        print ""
        print "loom, 2 ranks, per rank (fit_result::figures summed over the timed runs; seconds):"
        printf "%-5s %5s %4s %9s %7s %9s %7s %7s %8s %10s\n", "model", "batch", "rank", "compute_s", "comm_s", "exposed_s", \
          "wait_s", "data_s", "fit_s", "samples/s"
        for (i = 1; i <= nper; i++) print per[i]
      }
    }' "$1"
}

run_all() {
  local models=mlp,cnn batches=64,128 seconds=2 repeats=5 torch1=0 dchunk=0
  while [ $# -gt 0 ]; do
    case $1 in
      --model) models=$2; shift 2 ;;
      --batch) batches=$2; shift 2 ;;
      --seconds) seconds=$2; shift 2 ;;
      --repeats) repeats=$2; shift 2 ;;
      --torch-1) torch1=1; shift ;;
      --deterministic-chunk) dchunk=$2; shift 2 ;;
      *) die "unknown flag $1 (see the top of $0)" ;;
    esac
  done
  command -v mpirun >/dev/null || die "mpirun not found: apt-get install openmpi-bin libopenmpi-dev libboost-mpi-dev"
  check_torch
  build bench_data_parallel
  local bench="$build_dir/benchmarks/data_parallel/bench_data_parallel"
  [ -x "$bench" ] || die "$bench was not built (is loom::mpi configured? it needs Open MPI and Boost.MPI)"
  local results=${RESULTS:-$build_dir/data_parallel.txt}
  : >"$results"
  : >"$results.stderr"
  local mpi=(mpirun)
  [ "$(id -u)" != 0 ] || mpi+=(--allow-run-as-root)
  [ "$(nproc)" -ge 2 ] || mpi+=(--oversubscribe)
  # shellcheck disable=SC2206
  [ -z "${MPIRUN_FLAGS:-}" ] || mpi+=($MPIRUN_FLAGS)
  local common=(--seconds "$seconds" --repeats "$repeats")
  local started=$SECONDS row=0

  run_loom() {  # model batch ranks
    quiet_wait
    "${strip_env[@]}" "${mpi[@]}" -np "$3" "$bench" --model "$1" --batch "$2" --threads "$threads" "${common[@]}" \
      --deterministic-chunk "$dchunk" \
      2>>"$results.stderr" | tee -a "$results" >&2
  }
  tuned_blas_env "$py" 1
  run_torch() {  # model batch procs
    quiet_wait
    "${tuned_env[@]}" "$py" "$peer" --flush-denormal \
      --model "$1" --batch "$2" --procs "$3" --threads "$threads" "${common[@]}" 2>>"$results.stderr" | tee -a "$results" >&2
  }

  local m b
  for m in ${models//,/ }; do
    for b in ${batches//,/ }; do
      echo "run.sh: $m, global batch $b [$((SECONDS - started)) s]" >&2
      if [ $((row % 2)) = 0 ]; then
        run_loom "$m" "$b" 1; run_loom "$m" "$b" 2; run_torch "$m" "$b" 2
        [ "$torch1" = 0 ] || run_torch "$m" "$b" 1
      else
        [ "$torch1" = 0 ] || run_torch "$m" "$b" 1
        run_torch "$m" "$b" 2; run_loom "$m" "$b" 2; run_loom "$m" "$b" 1
      fi
      row=$((row + 1))
    done
  done

  local first_torch
  first_torch=$(grep -m1 '^row: impl=torch-ddp' "$results" || true)
  echo
  echo "Data-parallel training throughput, samples/s of all ranks together (median of $repeats runs of ~${seconds} s"
  echo "after a warm-up; $(nproc) cores: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - started)) s"
  echo "  loom:  trainer + data_parallel<mpi_comm>, ${mpi[*]} -np 1 / -np 2, $threads thread(s) per rank, memory-mapped"
  echo "         Fashion-MNIST, no BLAS/OpenMP tuning variables (env: $(field "$(grep -m1 '^row: impl=loom' "$results")" env))"
  [ "$dchunk" = 0 ] || echo "         split-invariant mode, fit_options::deterministic_chunk = $dchunk"
  echo "  torch: DistributedDataParallel, gloo on 127.0.0.1, torch.multiprocessing, $threads thread(s) per process, data"
  echo "         preloaded as tensors; $(tuned_blas_words)"
  echo "         OPENBLAS_NUM_THREADS=1, set_flush_denormal(True); blas $(field "$first_torch" blas), core $(field "$first_torch" blas_core)"
  cpu_header "$results"
  echo "  both:  He (fan_in) init, zero biases, SGD lr 0.02 momentum 0.9; the global batch split evenly over the ranks."
  echo "  efficiency = 2-rank samples/s / (2 x 1-rank samples/s) at the same global batch; same per rank = the same"
  echo "  against 1 rank at half the batch (each rank then runs the batch size it runs alone); exposed comm % = share of"
  echo "  rank 0's fit() time spent waiting for gradients after backward (2 ranks); others = cores other processes kept"
  echo "  busy (the most of the row's runs)."
  echo
  table "$results"
  echo
  echo "raw lines: $results (figures tables of each run: $results.stderr)"
}

case ${1:-} in
  table) [ -f "${2:-}" ] || die "usage: run.sh table RAW-LINES-FILE"; table "$2" ;;
  -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0" ;;
  *) run_all "$@" ;;
esac
