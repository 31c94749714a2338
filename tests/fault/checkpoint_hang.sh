#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A rank that hangs inside a checkpoint's collectives, once a checkpoint's time is measured, is
# detected within the checkpoint deadline derived from it (docs/fault-tolerance.md, "The
# protocol": deadline_steps times the longest checkpoint, at least min_checkpoint_deadline_s,
# 10 s), not after the flat startup_deadline_s (60 s) the peers waited there before, which is
# longer than loomrun's --recovery-timeout (30 s): a host dying in that window was restarted from
# the checkpoint instead of recovered in the process.
# Under `mpirun --enable-recovery`, rank R stops itself (SIGSTOP) as its K-th checkpoint begins
# (LOOM_TEST_STOP_AT_CHECKPOINT=K:R; its peers then wait for it in the checkpoint's first
# collective). Requires: status 0, ranks=NP-1, the roll call naming the stopped rank, the final
# checkpoint step-TOTAL (no step lost), and the time from the stop to the first good step after
# the recovery below LIMIT seconds. Prints that time.
#
# usage: checkpoint_hang.sh MPIEXEC NP PROGRAM WORKDIR K:R TOTAL EVERY LIMIT -- flags...
set -u
mpiexec=$1 np=$2 program=$3 work=$4 at=$5 total=$6 every=$7 limit=$8
shift 8
[ "$1" = "--" ] && shift
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/common.sh"
export LOOM_TEST_STOP_AT_CHECKPOINT=$at
(exec "${mpi[@]}" --enable-recovery -x LOOM_TEST_STOP_AT_CHECKPOINT -np "$np" "$program" "$@" --max-steps "$total" \
   --checkpoint-dir "$work/ck" --checkpoint-every "$every" > "$work/out" 2> "$work/err") &
job=$!
# The stopped process, once the run is over, if the survivors did not fence it (they do on one
# host): mpirun waits for every process it started.
stopped=""
for _ in $(seq 1 30000); do
  kill -0 $job 2> /dev/null || break
  [ -z "$stopped" ] && grep -q "^loom: test: rank [0-9]* stops itself" "$work/err" && stopped=1
  if [ -n "$stopped" ] && grep -q "^result: " "$work/out"; then
    for p in $(pgrep -P $job); do
      [ "$(awk '{print $3}' /proc/$p/stat 2> /dev/null)" = T ] && kill -9 "$p" 2> /dev/null
    done
  fi
  sleep 0.01
done
wait $job
status=$?
grep -E "^loom: (test|recovery)" "$work/err" | sed 's/\. Roll call:.*//'
[ "$status" -eq 0 ] || { cat "$work/err"; fail "the job ended with status $status, not 0"; }
grep -q "^loom: test: rank ${at#*:} stops itself (SIGSTOP) as checkpoint ${at%%:*} begins" "$work/err" ||
  { cat "$work/err"; fail "rank ${at#*:} did not stop itself at checkpoint ${at%%:*}"; }
grep -q "ranks=$((np - 1)) " "$work/out" || { cat "$work/out" "$work/err"; fail "the result line does not say ranks=$((np - 1))"; }
grep -q "did not answer within .*: the rank the others wait for" "$work/err" ||
  { cat "$work/err"; fail "the roll call does not name the stopped rank"; }
newest=$(ls "$work/ck" | grep -E '^step-[0-9]+$' | sed 's/step-//' | sort -n | tail -1)
[ "$newest" = "$total" ] || fail "the final checkpoint is step-$newest, expected step-$total: steps were lost"
stop_t=$(sed -n 's/^loom: test: rank [0-9]* stops itself.*(unix time \([0-9.]*\)).*/\1/p' "$work/err" | head -1)
good=$(sed -n 's/.*first good step.*(unix time \([0-9.]*\)).*/\1/p' "$work/err" | head -1)
[ -n "$good" ] || { cat "$work/err"; fail "no first good step after the recovery"; }
took=$(awk -v g="$good" -v s="$stop_t" 'BEGIN { printf "%.2f", g - s }')
echo "from the stop to the first good step after the recovery: $took s (limit $limit s)"
awk -v t="$took" -v l="$limit" 'BEGIN { exit !(t < l) }' ||
  fail "the hang inside checkpoint ${at%%:*} took $took s to recover from, not under $limit s: the checkpoint deadline was not derived from the measured checkpoints"
echo "PASS: rank ${at#*:} hung in checkpoint ${at%%:*}; detected and recovered from in $took s, under $limit s; ranks=$((np - 1)), final step $total"
