#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A slow checkpoint is not a failure (docs/fault-tolerance.md, "Deadlines"): under
# `mpirun --enable-recovery` the step-derived deadline of a fast model is its floor
# (fault_options::min_deadline_s, 0.5 s), and rank 0 here takes 1.5 s more to write each periodic
# checkpoint (LOOM_TEST_SLOW_CHECKPOINT_S, as a slow disk would). Its peers wait for it in the
# checkpoint's collectives and in the next step's allreduce: those keep the longer checkpoint
# deadline, so the run must end with status 0 on every rank, no recovery reported, every
# checkpoint committed and the final weights byte for byte those of the same run without the
# delay (--deterministic-chunk).
#
# usage: slow_checkpoint.sh MPIEXEC NP PROGRAM WORKDIR -- flags...
set -u
mpiexec=$1 np=$2 program=$3 work=$4
shift 4
[ "$1" = "--" ] && shift
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/common.sh"
steps=120 every=40
flags=("$@" --max-steps $steps --checkpoint-every $every)
run() {  # name, extra environment for mpirun (-x ...)
  local name=$1
  shift
  local t0=$SECONDS
  "${mpi[@]}" --enable-recovery "$@" -np "$np" "$program" "${flags[@]}" --checkpoint-dir "$work/$name.ck" \
    --save-weights "$work/$name.safetensors" > "$work/$name.out" 2> "$work/$name.err"
  local status=$?
  echo "$name: status $status after $((SECONDS - t0)) s"
  [ $status -eq 0 ] || { cat "$work/$name.err"; fail "the $name run ended with status $status"; }
  grep -q "ranks=$np" "$work/$name.out" || { cat "$work/$name.out"; fail "the $name run's result line does not say ranks=$np"; }
  if grep "loom: recovery" "$work/$name.err"; then
    fail "the $name run reported a recovery: a peer's deadline expired while rank 0 wrote a checkpoint"
  fi
  [ -d "$work/$name.ck/step-$steps" ] || fail "the $name run committed no final checkpoint step-$steps"
}
run plain
LOOM_TEST_SLOW_CHECKPOINT_S=1.5 run slow -x LOOM_TEST_SLOW_CHECKPOINT_S
cmp "$work/plain.safetensors" "$work/slow.safetensors" || fail "the slow-checkpoint run's weights differ from the plain run's"
echo "PASS: rank 0 took 1.5 s more per checkpoint ($((steps / every)) of them); no deadline expired, every rank finished, same weights"
