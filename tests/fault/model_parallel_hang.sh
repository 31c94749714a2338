#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A hung rank of a job that cannot recover in place — a pipeline stage or a tensor slice, held
# once (docs/fault-tolerance.md, "Where no recovery is possible"). NP ranks of PROGRAM with a
# checkpoint every EVERY steps and a fixed deadline (--fault-deadline, in the flags); once the
# first checkpoint is committed, SIGSTOP of a random rank at a random step 50-450 steps later
# (read from the ranks' metrics). Then:
#   1. under plain mpirun the job must end by itself (it used to hang forever): every other rank's
#      wait times out, the roll call names the stopped process ("loom: failure at step ...: lost
#      rank R (world rank R, pid P ...)", "did not answer"), and mpirun exits with a non-zero
#      status within the deadline plus a margin;
#   2. under loomrun (mpirun --enable-recovery, where nothing would kill the stopped process)
#      the roll call names it, a survivor on its host ends it, every survivor ends, and loomrun
#      restarts the job from the newest checkpoint: it finishes with status 0 and the weights,
#      byte for byte, of the run without a failure.
#   With HANG_RECOVERS_IN_PLACE=K in the environment (a hybrid with tensor parallelism, whose
#   data-parallel axis recovers in the process), 2. is instead: the survivors leave the stopped
#   rank's replica out and finish on K ranks, with no restart.
# Prints the time from the SIGSTOP to the report.
# usage: model_parallel_hang.sh LOOMRUN MPIEXEC NP PROGRAM WORKDIR TOTAL EVERY -- flags...
set -u
loomrun=$1 mpiexec=$2 np=$3 program=$4 work=$5 total=$6 every=$7
shift 7
[ "$1" = "--" ] && shift
flags=("$@" --max-steps "$total")
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/common.sh"

echo "== the run without a failure ($np ranks)"
"${mpi[@]}" -np "$np" "$program" "${flags[@]}" --save-weights "$work/clean.safetensors" > "$work/clean.out" 2> "$work/clean.err" ||
  { cat "$work/clean.err"; fail "the clean run failed"; }
tail -1 "$work/clean.out"

# The ranks' step, read from their metrics (--metrics-jsonl, a line per step): the highest.
step_now() {
  local f s best=0
  for f in "$1"/m.rank*.jsonl; do
    s=$(tail -n 1 "$f" 2> /dev/null | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
    [ -n "$s" ] && [ "$s" -gt "$best" ] && best=$s
  done
  echo "$best"
}
# stop_one DIR JOB: waits for DIR/ck/step-EVERY, then for a random step 50-450 steps after it,
# and SIGSTOPs a random rank process of JOB (mpirun's child, or under loomrun mpirun's
# grandchild) while it trains; sets stopped (pid) and stopped_at. The moment is taken by step,
# not by time: on a fast machine whose checkpoint reaches the disk late, a fixed delay after
# the checkpoint could land after the run's last collective, when the stopped rank hangs
# nothing.
stop_one() {
  local d=$1 job=$2 pids=() target at
  for _ in $(seq 1 6000); do [ -d "$d/ck/step-$every" ] && break; kill -0 "$job" 2> /dev/null || break; sleep 0.01; done
  [ -d "$d/ck/step-$every" ] || { cat "$d/err"; fail "no checkpoint step-$every appeared"; }
  target=$((every + 50 + RANDOM % 400))
  for _ in $(seq 1 6000); do [ "$(step_now "$d")" -ge "$target" ] && break; kill -0 "$job" 2> /dev/null || break; sleep 0.005; done
  at=$(step_now "$d")
  [ "$at" -ge "$target" ] || { cat "$d/err"; fail "the ranks did not reach step $target (at $at)"; }
  [ "$at" -lt $((total - 500)) ] || fail "the ranks were at step $at of $total when the stop was due: too close to the end to hang the job"
  mapfile -t pids < <(pgrep -f -- "^$program " | sort -n)
  [ "${#pids[@]}" -eq "$np" ] || fail "found ${#pids[@]} processes of $program, expected $np"
  stopped=${pids[$((RANDOM % np))]}
  kill -STOP "$stopped"
  stopped_at=$(now)
  echo "SIGSTOP of pid $stopped at $stopped_at, at step $at"
}
# check_report ERRFILE: the roll call names the stopped process and its silence.
check_report() {
  grep -m1 "^loom: failure at step" "$1" || { cat "$1"; fail "no rank reported the failure ('loom: failure at step')"; }
  grep -q "^loom: failure at step [0-9]*: lost rank [0-9]* (world rank [0-9]*, pid $stopped on " "$1" ||
    { cat "$1"; fail "the report does not name the stopped process (pid $stopped) as the one lost"; }
  grep -q "pid $stopped on .*did not answer within" "$1" || { cat "$1"; fail "the roll call does not say pid $stopped did not answer"; }
  grep -m1 "^loom: resume from the newest checkpoint" "$1" || fail "the report does not say how to go on"
}

echo "== plain mpirun: SIGSTOP of one rank; the job must end by itself"
d=$work/plain && mkdir -p "$d"
(exec "${mpi[@]}" -np "$np" "$program" "${flags[@]}" --checkpoint-dir "$d/ck" --checkpoint-every "$every" \
   --metrics-jsonl "$d/m.jsonl" --monitor-every 0 > "$d/out" 2> "$d/err") &
job=$!
stop_one "$d" $job
for _ in $(seq 1 600); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
if kill -0 $job 2> /dev/null; then
  kill -CONT "$stopped"; kill -9 $job; fail "the job did not end within 60 s of the SIGSTOP: it hangs"
fi
wait $job
status=$?
ended=$(now)
echo "mpirun ended with status $status, $(awk "BEGIN { printf \"%.2f\", $ended - $stopped_at }") s after the SIGSTOP"
[ "$status" -ne 0 ] || fail "mpirun ended with status 0 after a rank hung"
check_report "$d/err"
gone() { ! ps -o stat= -p "$1" | grep -qv Z; }  # no such process, or a zombie waiting to be reaped
for _ in $(seq 1 100); do gone "$stopped" && break; sleep 0.1; done
gone "$stopped" || { kill -9 "$stopped"; fail "the stopped process $stopped outlived the job by 10 s"; }

echo "== loomrun: SIGSTOP of one rank; the job ends, loomrun restarts it from the newest checkpoint"
d=$work/loomrun && mkdir -p "$d"
(exec "$loomrun" -np "$np" --recovery-timeout 10 --mpirun-arg --oversubscribe --mpirun-arg --bind-to --mpirun-arg none -- \
   "$program" "${flags[@]}" --checkpoint-dir "$d/ck" --checkpoint-every "$every" --save-weights "$d/weights.safetensors" \
   --metrics-jsonl "$d/m.jsonl" --monitor-every 0 > "$d/out" 2> "$d/err") &
job=$!
stop_one "$d" $job
for _ in $(seq 1 1800); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
if kill -0 $job 2> /dev/null; then
  kill -CONT "$stopped"; pkill -9 -f -- "^$program "; kill -9 $job; fail "loomrun did not end within 180 s of the SIGSTOP"
fi
wait $job
status=$?
[ "$status" -eq 0 ] || { cat "$d/err"; fail "loomrun ended with status $status, not 0"; }
if [ -n "${HANG_RECOVERS_IN_PLACE:-}" ]; then
  # A hybrid with tensor parallelism: its replicas recover in the process (the stopped rank's
  # replica leaves); hybrid_recovery.sh checks such runs' weights against a reference.
  grep -m1 "^loom: recovery 1 at step [0-9]*: lost rank [0-9]* (world rank [0-9]*, pid $stopped on " "$d/err" | cut -c1-300 ||
    { cat "$d/err"; fail "no in-process recovery named the stopped process (pid $stopped) as lost"; }
  grep -q "pid $stopped on .*did not answer within" "$d/err" || { cat "$d/err"; fail "the roll call does not say pid $stopped did not answer"; }
  ! grep -q "^loomrun: restart" "$d/err" || { cat "$d/err"; fail "loomrun restarted the job: it was not recovered in the process"; }
  grep -q "^result: .* ranks=$HANG_RECOVERS_IN_PLACE " "$d/out" || { cat "$d/out"; fail "the result line does not say ranks=$HANG_RECOVERS_IN_PLACE"; }
  echo "PASS: a stopped rank ended the job with a roll call naming it under plain mpirun; under loomrun the whole replicas went on without it, in the process"
  exit 0
fi
check_report "$d/err"
grep -m1 "^loomrun: restart 1 of .*from the newest checkpoint" "$d/err" || { cat "$d/err"; fail "loomrun did not restart the job from its checkpoint"; }
grep -q "^result: " "$d/out" || fail "the restarted job printed no result line"
cmp "$work/clean.safetensors" "$d/weights.safetensors" || fail "the restarted run's weights differ from the run without a failure"
echo "PASS: a stopped rank ended the job with a roll call naming it, under plain mpirun and under loomrun, which restarted it from its checkpoint to the clean run's weights"
