#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# --quiet silences progress and tables, never a warning. Each case runs PROGRAM with --quiet and
# requires its warning on stderr (or, for a preemption, the line saying where its checkpoint is):
#   1. a refused checkpoint: the newest checkpoint's optimizer file has one flipped byte; --resume
#      names it, the tensor and both CRCs, and the step it resumed from instead;
#   2. a preemption: SIGTERM to a process training alone; it commits a checkpoint and says so;
#   3. a lost rank: kill -9 of one of 3 ranks under `mpirun --enable-recovery`; the survivors
#      report the recovery and finish on 2 ranks.
# usage: quiet_warnings.sh MPIEXEC PROGRAM WORKDIR -- flags...
set -u
mpiexec=$1 program=$2 work=$3
shift 3
[ "$1" = "--" ] && shift
flags=("$@" --quiet)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
mpi=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)

echo "== 1. a refused checkpoint under --quiet"
d=$work/refused && mkdir -p "$d"
"$program" "${flags[@]}" --optimizer adam --lr 0.001 --max-steps 30 --checkpoint-dir "$d/ck" --checkpoint-every 10 \
  > "$d/first.out" 2> "$d/first.err" || { cat "$d/first.err"; fail "the first run failed"; }
[ -s "$d/first.err" ] && { cat "$d/first.err"; fail "the first run printed on stderr under --quiet with nothing to warn of"; }
opt=$(ls "$d/ck/step-30"/optimizer-*.safetensors 2> /dev/null | head -1)
[ -n "$opt" ] || fail "step-30 has no optimizer file"
# Flip the last byte (tensor data, past the header).
size=$(stat -c %s "$opt")
byte=$(od -An -tu1 -j $((size - 1)) -N1 "$opt" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$opt" bs=1 seek=$((size - 1)) conv=notrunc status=none
"$program" "${flags[@]}" --optimizer adam --lr 0.001 --max-steps 40 --checkpoint-dir "$d/ck" --checkpoint-every 10 --resume \
  > "$d/resumed.out" 2> "$d/resumed.err" || { cat "$d/resumed.err"; fail "the resumed run failed"; }
cat "$d/resumed.err"
grep -q "^loom: checkpoint .*step-30 cannot be used: .*optimizer-.*safetensors" "$d/resumed.err" ||
  fail "under --quiet, no warning named the refused checkpoint and its file"
grep -qi "crc" "$d/resumed.err" || fail "the warning does not give the checksums"
grep -q "^loom: resumed from .*step-20 " "$d/resumed.err" || fail "under --quiet, nothing said which checkpoint it resumed from instead"
grep -q "^result: " "$d/resumed.out" || fail "the resumed run printed no result line"

echo "== 2. a preemption under --quiet"
d=$work/preempted && mkdir -p "$d"
(exec "$program" "${flags[@]}" --max-steps 100000 --checkpoint-dir "$d/ck" --checkpoint-every 20 > "$d/out" 2> "$d/err") &
job=$!
for _ in $(seq 1 3000); do [ -d "$d/ck/step-20" ] && break; kill -0 $job 2> /dev/null || break; sleep 0.01; done
[ -d "$d/ck/step-20" ] || { cat "$d/err"; fail "no checkpoint step-20 appeared"; }
kill -TERM $job
wait $job
status=$?
cat "$d/out"
[ "$status" -eq 0 ] || fail "the preempted process ended with status $status"
grep -q "stopped by signal 15 at step [0-9]*; checkpoint committed: .*step-[0-9]* (continue with --resume)" "$d/out" ||
  fail "under --quiet, the preemption's checkpoint was not named"

echo "== 3. a lost rank under --quiet (mpirun --enable-recovery)"
d=$work/lost && mkdir -p "$d"
(exec "${mpi[@]}" --enable-recovery -np 3 "$program" "${flags[@]}" --max-steps 600 --checkpoint-dir "$d/ck" \
   --checkpoint-every 20 > "$d/out" 2> "$d/err") &
job=$!
for _ in $(seq 1 3000); do [ -d "$d/ck/step-20" ] && break; kill -0 $job 2> /dev/null || break; sleep 0.01; done
[ -d "$d/ck/step-20" ] || { cat "$d/err"; fail "no checkpoint step-20 appeared"; }
victim=$(pgrep -P $job | tail -1)
[ -n "$victim" ] || fail "found no rank process under mpirun ($job)"
kill -9 "$victim"
wait $job
grep "^loom: recovery 1 " "$d/err" | cut -c1-200
grep -q "^loom: recovery 1 at step [0-9]*: lost rank" "$d/err" || { cat "$d/err"; fail "under --quiet, no line reported the lost rank and the recovery"; }
grep -q "^result: .* ranks=2 " "$d/out" || { cat "$d/out"; fail "the survivors did not finish on 2 ranks"; }
echo "PASS: under --quiet a refused checkpoint, a preemption and a lost rank are each reported"
