#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What surviving a failed rank costs (docs/fault-tolerance.md), with examples/fashion_mnist (mlp,
# batch 64) data parallel under mpirun --enable-recovery on this machine:
#   recovery  TRIALS runs of 4 ranks, each losing a random rank (kill -9, or SIGSTOP: a hang) at a
#             random moment: per failure, the wait that failed (detection), the agreement (roll
#             call, verdict, ready round), the communicator rebuild, the healing (state from the
#             most advanced survivor) and the time from the signal to the first good step after it;
#             medians and maxima. Three kinds: kill -9 seen through this host's /proc (the one-host
#             path), kill -9 with that evidence off (LOOM_FAULT_NO_LOCAL_EVIDENCE=1: the deadline
#             path a failure on another host takes), and SIGSTOP.
#   deadline  the steady-state cost of failure detection: ROUNDS paired runs of 2 ranks with and
#             without it (--no-fault-detection), median ratio of samples/s (target >= 0.99): data
#             parallel (fashion_mnist), a pipeline of 2 stages (examples/pipeline) and tensor
#             parallelism over 2 slices (examples/tensor_parallel), whose every communicator has
#             the deadlines too (the job ends after a roll call instead of recovering); and the
#             hybrid of examples/tensor_parallel on 4 ranks under --enable-recovery, which also
#             commits each step over the world (docs/fault-tolerance.md, "Hybrids").
#   commit    the steady-state cost of the hybrids' step commit alone: ROUNDS paired runs of 4
#             ranks (2 replicas of tensor_parallel<2>, and of a 2-stage pipeline), both with
#             failure detection, under --enable-recovery (the fit recovers: each step committed)
#             and under plain mpirun (no commit); median ratio of samples/s (target >= 0.99).
#   after     throughput after a recovery: a 4-rank run that loses a rank early against a clean
#             3-rank run of the same steps, median ratio of samples/s over ROUNDS pairs; over
#             shared memory, and with --btl tcp,self over TCP (this host's loopback), the path
#             ranks on different hosts take.
#   run.sh [--part recovery,deadline,commit,after] [--trials 10] [--rounds 5] [--steps 1500] [--btl LIST]
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (default 1), QUIET_WAIT (see lib.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
source "$repo/benchmarks/common/lib.sh"
case ${1:-} in -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
args=("$@")
flag() { local i; for ((i = 0; i + 1 < ${#args[@]}; i++)); do [ "${args[i]}" != "--$1" ] || { echo "${args[i + 1]}"; return; }; done; echo "$2"; }
parts=$(flag part recovery,deadline,commit,after)
trials=$(flag trials 10)
rounds=$(flag rounds 5)
steps=$(flag steps 1500)
btl=$(flag btl "")
btl_args=()
[ -z "$btl" ] || btl_args=(--mca btl "$btl")
build fashion_mnist pipeline tensor_parallel
program=$build_dir/examples/fashion_mnist/fashion_mnist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--epochs 100 --train-samples 12800 --test-samples 500 --threads 1 --quiet --max-steps "$steps")
mpi() { local n=$1; shift; "${strip_env[@]}" OMP_NUM_THREADS=1 mpirun $(mpi_flags "$n") --bind-to none "$@"; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }
maxof() { sort -g | tail -1; }
sps() { sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p' "$1"; }

echo "Fault tolerance, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(cpu_line)"

if [[ $parts == *recovery* ]]; then
  for kind in kill-local kill-deadline stop; do
    : > "$work/$kind.txt"
    for t in $(seq 1 "$trials"); do
      quiet_wait
      d=$work/$kind-$t
      mkdir -p "$d"
      # (exec: $! is mpirun's own pid, whose children are the ranks)
      (export LOOM_FAULT_NO_LOCAL_EVIDENCE=$([ "$kind" = kill-deadline ] && echo 1 || echo 0)
       exec "${strip_env[@]}" OMP_NUM_THREADS=1 mpirun $(mpi_flags 4) --bind-to none --enable-recovery \
         -x LOOM_FAULT_NO_LOCAL_EVIDENCE "$program" "${common[@]}" --checkpoint-dir "$d/ck" --checkpoint-every 50 \
         > "$d/out" 2> "$d/err") &
      job=$!
      for _ in $(seq 1 6000); do [ -d "$d/ck/step-50" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
      sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", r / 32767 }')"
      mapfile -t pids < <(pgrep -P $job | sort -n)
      victim=${pids[$((RANDOM % ${#pids[@]}))]}
      if [ "$kind" = stop ]; then kill -STOP "$victim"; else kill -9 "$victim"; fi
      at=$(date +%s.%N)
      wait $job || true
      line=$(grep -m1 '^loom: recovery 1 at step' "$d/err" || true)
      good=$(sed -n 's/.*first good step.*(unix time \([0-9.]*\)).*/\1/p' "$d/err" | head -1)
      kill -9 "$victim" 2>/dev/null || true
      [ -n "$line" ] && [ -n "$good" ] || { echo "  $kind trial $t: no recovery report (see below)"; tail -3 "$d/err"; continue; }
      det=$(sed -n 's/.* after \([0-9.]*\) s waiting.*/\1/p' <<< "$line")
      agr=$(sed -n 's/.*agreement \([0-9.]*\) s.*/\1/p' <<< "$line")
      reb=$(sed -n 's/.*rebuild \([0-9.]*\) s.*/\1/p' <<< "$line")
      heal=$(sed -n 's/.*this rank had [0-9]*) \([0-9.]*\) s.*/\1/p' <<< "$line")
      first=$(awk -v g="$good" -v a="$at" 'BEGIN { printf "%.3f", g - a }')
      echo "$det $agr $reb $heal $first" >> "$work/$kind.txt"
    done
  done
  echo
  echo "Per failure, 4 ranks -> 3, mlp batch 64, seconds: median / max over the trials"
  printf '  %-14s %6s | %13s %13s %13s %13s | %15s\n' failure trials detection agreement rebuild healing "signal->1st good"
  for kind in kill-local kill-deadline stop; do
    f=$work/$kind.txt
    n=$(wc -l < "$f")
    row=()
    for c in 1 2 3 4 5; do row+=("$(cut -d' ' -f$c "$f" | median) / $(cut -d' ' -f$c "$f" | maxof)"); done
    printf '  %-14s %6s | %13s %13s %13s %13s | %15s\n' "$kind" "$n" "${row[@]}"
  done
fi

if [[ $parts == *deadline* ]]; then
  # tensor_parallel:4 is the hybrid (2 replicas of 2 slices) under mpirun --enable-recovery: its
  # detection plus the step commit (one 8-byte allreduce over the world per step).
  for spec in fashion_mnist:2 pipeline:2 tensor_parallel:2 tensor_parallel:4; do
    example=${spec%:*} n=${spec#*:}
    p=$build_dir/examples/$example/$example
    recovery=()
    [ "$n" -eq 2 ] || recovery=(--enable-recovery)
    : > "$work/deadline-$spec.txt"
    for r in $(seq 1 "$rounds"); do
      quiet_wait
      mpi "$n" "${recovery[@]}" "$p" "${common[@]}" > "$work/on.out" 2>/dev/null
      mpi "$n" "${recovery[@]}" "$p" "${common[@]}" --no-fault-detection > "$work/off.out" 2>/dev/null
      echo "$(sps "$work/on.out") $(sps "$work/off.out")" >> "$work/deadline-$spec.txt"
    done
    echo
    echo "Failure detection in steady state, $example: $n ranks${recovery:+ (a hybrid under --enable-recovery: detection and the step commit)}, $steps steps, $rounds paired rounds (samples/s)"
    awk '{ printf "  round %d: on %s, off %s, ratio %.3f\n", NR, $1, $2, $1 / $2 }' "$work/deadline-$spec.txt"
    echo "  median ratio on/off: $(awk '{ print $1 / $2 }' "$work/deadline-$spec.txt" | median)"
  done
fi

if [[ $parts == *commit* ]]; then
  for spec in tensor_parallel pipeline; do
    p=$build_dir/examples/$spec/$spec
    extra=()
    [ "$spec" = pipeline ] && extra=(--stages 2)
    : > "$work/commit-$spec.txt"
    for r in $(seq 1 "$rounds"); do
      quiet_wait
      mpi 4 --enable-recovery "$p" "${common[@]}" "${extra[@]}" > "$work/on.out" 2>/dev/null
      mpi 4 "$p" "${common[@]}" "${extra[@]}" > "$work/off.out" 2>/dev/null
      echo "$(sps "$work/on.out") $(sps "$work/off.out")" >> "$work/commit-$spec.txt"
    done
    echo
    echo "The step commit, $spec hybrid: 4 ranks (2 replicas), failure detection on in both, $steps steps, $rounds paired rounds (samples/s, with the commit under --enable-recovery / without under plain mpirun)"
    awk '{ printf "  round %d: commit %s, none %s, ratio %.3f\n", NR, $1, $2, $1 / $2 }' "$work/commit-$spec.txt"
    echo "  median ratio commit/none: $(awk '{ print $1 / $2 }' "$work/commit-$spec.txt" | median)"
  done
fi

if [[ $parts == *after* ]]; then
  : > "$work/after.txt"
  for r in $(seq 1 "$rounds"); do
    quiet_wait
    d=$work/after-$r
    mkdir -p "$d"
    (exec "${strip_env[@]}" OMP_NUM_THREADS=1 mpirun $(mpi_flags 4) --bind-to none --enable-recovery "${btl_args[@]}" "$program" "${common[@]}" \
       --checkpoint-dir "$d/ck" --checkpoint-every 50 > "$d/out" 2> "$d/err") &
    job=$!
    for _ in $(seq 1 6000); do [ -d "$d/ck/step-50" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
    mapfile -t pids < <(pgrep -P $job | sort -n)
    kill -9 "${pids[1]}"
    wait $job || true
    mpi 3 --enable-recovery "${btl_args[@]}" "$program" "${common[@]}" > "$d/clean.out" 2>/dev/null
    echo "$(sps "$d/out") $(sps "$d/clean.out")" >> "$work/after.txt"
  done
  echo
  echo "Throughput of a run that lost 1 of 4 ranks at step ~50 against a clean 3-rank run, $steps steps, MPI transports ${btl:-the default (shared memory here)} (samples/s)"
  awk '{ printf "  round %d: recovered %s, clean 3 ranks %s, ratio %.3f\n", NR, $1, $2, $1 / $2 }' "$work/after.txt"
  echo "  median ratio: $(awk '{ print $1 / $2 }' "$work/after.txt" | median)"
fi
