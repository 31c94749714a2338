#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real straggler: the main example on 2 ranks, rank 0 bound to core 0 and rank 1 to core 1
# (taskset, explicitly), with busy loops pinned to core 1 so rank 1 gets a fraction of its core.
# Passes when the live view names rank 1 within the 20 steps run (the first exchange is at step
# 10), and the end-of-run table, the diagnosis, TensorBoard (rank 0's live/straggler_rank
# scalar, read by TensorBoard's EventAccumulator with PYTHON) and the merged timeline (its
# "straggler: rank 1" instant) name rank 1 too.
# Usage: straggler_check.sh MPIEXEC PROGRAM WORK_DIR PYTHON [HOGS]
set -euo pipefail
mpiexec=$1 program=$2 work=$3 python=$4 hogs=${5:-3}
if [ "$(getconf _NPROCESSORS_ONLN)" -lt 2 ]; then
  echo "needs 2 cores, this machine has $(getconf _NPROCESSORS_ONLN)"
  exit 1
fi
rm -rf "$work" && mkdir -p "$work"
pids=()
stop_hogs() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
# Each loop in its own session: with the kernel's autogroup scheduling (on by default), a
# session is one scheduling group, so each loop takes a group's share of core 1 from rank 1
# without diluting the share of this session's ranks elsewhere.
for i in $(seq "$hogs"); do
  setsid sh -c 'echo $$ > "$1"; exec taskset -c 1 sh -c "while :; do :; done"' hog "$work/hog$i.pid" &
done
for i in $(seq "$hogs"); do
  until [ -s "$work/hog$i.pid" ]; do sleep 0.01; done
  pids+=("$(cat "$work/hog$i.pid")")
done
# The cnn: its steps (tens of ms) span many of the scheduler's time slices, so a shared core
# shows in the median step; most of the mlp's (under 1 ms) fit within one slice, and the time
# rank 1 loses falls into its waits in the allreduce, where both ranks wait alike.
args=(--model cnn --max-steps 20 --train-samples 6400 --test-samples 200 --threads 1 --live-every 0.01
      --tensorboard "$work/tb" --trace "$work/trace.json")
"$mpiexec" --allow-run-as-root --oversubscribe --bind-to none \
  -np 1 taskset -c 0 "$program" "${args[@]}" : -np 1 taskset -c 1 "$program" "${args[@]}" >"$work/out.txt" 2>&1
stop_hogs
cat "$work/out.txt"
fail() {
  echo "FAILED: $*"
  exit 1
}
# The steps ran: at most 20, so any straggler line came within them.
grep -q '^result: .*epochs=1 ' "$work/out.txt" || fail "no result line"
heads=$(grep -c '^live: step ' "$work/out.txt" || true)
[ "$heads" -ge 1 ] || fail "no live view"
named=$(grep -m1 '^live: straggler: ' "$work/out.txt" || true)
[[ $named == "live: straggler: rank 1 "* ]] || fail "the live view does not name rank 1 first: '$named'"
grep -q '^straggler: rank 1 ' "$work/out.txt" || fail "the end-of-run table does not name rank 1"
grep -q '^diagnosis: rank 1 held the others back' "$work/out.txt" || fail "the diagnosis does not name rank 1"
# TensorBoard: rank 0's live/straggler_rank, one point per exchange, names rank 1 at some step <= 20.
"$python" - "$work/tb/rank0" <<'PY' || fail "TensorBoard does not name rank 1"
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
points = [(e.step, e.value) for e in acc.Scalars("live/straggler_rank")]
print("TensorBoard live/straggler_rank:", points)
assert points and all(s <= 20 for s, _ in points), points
assert any(v == 1 for _, v in points), points
assert all(v in (-1, 1) for _, v in points), points
PY
# The merged timeline: a "straggler: rank 1" instant on rank 0's process, and none naming rank 0.
/usr/bin/python3 - "$work/trace.json" <<'PY' || fail "the timeline does not name rank 1"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
named = [e for e in events if e["ph"] == "i" and e["name"].startswith("straggler: ")]
print("timeline:", [(e["pid"], e["name"], e["args"]["step"]) for e in named])
assert any(e["name"] == "straggler: rank 1" and e["args"]["rank"] == 1 for e in named), named
assert all(e["args"]["rank"] == 1 and e["args"]["step"] <= 20 for e in named), named
PY
echo "the live view, the table, the diagnosis, TensorBoard and the timeline name rank 1"
