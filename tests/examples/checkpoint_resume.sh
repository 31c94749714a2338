#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Exact resume across a real failure or a signal, with real mpirun processes:
#   1. the uninterrupted run: NP ranks of PROGRAM to --max-steps TOTAL, its weights saved;
#   2. the same run with a checkpoint every EVERY steps, stopped once WAIT_STEP's checkpoint is
#      committed — MODE=kill: kill -9 of one rank (mpirun then ends the job), MODE=signal:
#      SIGUSR1 to mpirun, which forwards it to every rank (the job must end with status 0, the
#      line naming its checkpoint, within the time printed); MODE=term: one process started
#      without mpirun (NP=1) and SIGTERM to it, as SLURM or a container runtime sends it;
#   3. a run resuming from the newest valid checkpoint on NP_RESUME ranks to TOTAL;
# and passes when 3's weights are byte for byte 1's.
# usage: checkpoint_resume.sh MODE MPIEXEC NP NP_RESUME PROGRAM WORKDIR TOTAL EVERY WAIT_STEP -- flags...
set -u
mode=$1 mpiexec=$2 np=$3 np_resume=$4 program=$5 work=$6 total=$7 every=$8 wait_step=$9
shift 9
[ "$1" = "--" ] && shift
flags=("$@")
mpi=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np)
run() {  # run NP PROGRAM ARGS...: under mpirun, or alone in MODE=term
  local n=$1
  shift
  if [ "$mode" = term ]; then "$@"; else "${mpi[@]}" "$n" "$@"; fi
}
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

echo "== the uninterrupted run"
run "$np" "$program" "${flags[@]}" --max-steps "$total" --save-weights "$work/full.safetensors" \
  > "$work/full.out" 2> "$work/full.err" || { cat "$work/full.err"; fail "the uninterrupted run failed"; }
tail -1 "$work/full.out"

echo "== the run that is stopped ($mode) after step $wait_step's checkpoint"
# (exec: $! is then mpirun's, or the program's, own pid)
stopped=(--max-steps "$total" --checkpoint-dir "$work/ck" --checkpoint-every "$every")
if [ "$mode" = term ]; then
  (exec "$program" "${flags[@]}" "${stopped[@]}" > "$work/stopped.out" 2> "$work/stopped.err") &
else
  (exec "${mpi[@]}" "$np" "$program" "${flags[@]}" "${stopped[@]}" > "$work/stopped.out" 2> "$work/stopped.err") &
fi
job=$!
for _ in $(seq 1 3000); do
  [ -d "$work/ck/step-$wait_step" ] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.01
done
[ -d "$work/ck/step-$wait_step" ] || { cat "$work/stopped.err"; fail "no checkpoint step-$wait_step appeared"; }
start=$(date +%s.%N)
if [ "$mode" = kill ]; then
  rank=$(pgrep -P $job | head -1)
  [ -n "$rank" ] || fail "found no rank process under mpirun ($job)"
  kill -9 "$rank"
  echo "kill -9 of rank process $rank"
elif [ "$mode" = term ]; then
  kill -TERM $job
  echo "SIGTERM to the process ($job)"
else
  kill -USR1 $job
  echo "SIGUSR1 to mpirun ($job)"
fi
wait $job
status=$?
end=$(date +%s.%N)
echo "the job ended with status $status, $(awk "BEGIN { printf \"%.2f\", $end - $start }") s after the $mode"
newest=$(ls "$work/ck" | grep -E '^step-[0-9]+$' | sed 's/step-//' | sort -n | tail -1)
echo "newest committed checkpoint: step-$newest"
[ "$newest" -lt "$total" ] || fail "the run reached its end before it was stopped: nothing was tested"
if [ "$mode" = kill ]; then
  [ "$status" -ne 0 ] || fail "the killed job ended with status 0"
else
  [ "$status" -eq 0 ] || { cat "$work/stopped.err"; fail "the signalled job ended with status $status, not 0"; }
  signal=10
  [ "$mode" = term ] && signal=15
  grep -q "stopped by signal $signal at step $newest; checkpoint committed: $work/ck/step-$newest" "$work/stopped.out" ||
    { cat "$work/stopped.out"; fail "no line naming the checkpoint step-$newest"; }
  grep "stopped by signal" "$work/stopped.out"
fi

echo "== the run resumed on $np_resume rank(s)"
run "$np_resume" "$program" "${flags[@]}" --max-steps "$total" --checkpoint-dir "$work/ck" --resume \
  --save-weights "$work/resumed.safetensors" > "$work/resumed.out" 2> "$work/resumed.err" ||
  { cat "$work/resumed.err"; fail "the resumed run failed"; }
grep "resumed from" "$work/resumed.err" || fail "the run did not say where it resumed from"
tail -1 "$work/resumed.out"
cmp "$work/full.safetensors" "$work/resumed.safetensors" || fail "the resumed run's weights differ from the uninterrupted run's"
echo "PASS: the resumed run's weights are bitwise the uninterrupted run's"
rm -rf "$work"
