#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Synchronized batch norm across an in-process recovery: the resnet example with --sync-bn on
# NP ranks under `mpirun --enable-recovery`, kill -9 of a random rank once its first checkpoint
# is committed; the survivors rebuild their communicator and their batch norms go on summing
# their statistics over it. Requires: exit status 0, a `loom: recovery` report, the `result:`
# line with ranks=NP-1, and every step taken (the final checkpoint is step-TOTAL).
#
# usage: sync_bn_recovery.sh MPIEXEC NP PROGRAM WORKDIR TOTAL -- flags...
set -u
mpiexec=$1 np=$2 program=$3 work=$4 total=$5
shift 5
[ "$1" = "--" ] && shift
rm -rf "$work" && mkdir -p "$work/status"
source "$(dirname "$0")/common.sh"
export LOOM_STATUS_DIR="$work/status"
(exec "${mpi[@]}" --enable-recovery -x LOOM_STATUS_DIR -np "$np" "$program" --sync-bn "$@" --max-steps "$total" \
   --checkpoint-dir "$work/ck" --checkpoint-every 10 > "$work/out" 2> "$work/err") &
job=$!
for _ in $(seq 1 6000); do [ -d "$work/ck/step-10" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
[ -d "$work/ck/step-10" ] || { cat "$work/err"; fail "no first checkpoint appeared"; }
sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", r / 32767 * 0.5 }')"
mapfile -t pids < <(pgrep -P "$job" | sort -n)  # mpirun's children: the ranks
[ "${#pids[@]}" -eq "$np" ] || fail "found ${#pids[@]} rank processes under mpirun, expected $np"
i=$((RANDOM % np))
kill -9 "${pids[$i]}"
echo "kill -9 of the rank process ${pids[$i]} (index $i of $np)"
wait $job
status=$?
cat "$work/out"
grep "loom: recovery" "$work/err" | head -3
[ "$status" -eq 0 ] || { tail -20 "$work/err"; fail "the job ended with status $status"; }
grep -q "loom: recovery" "$work/err" || { tail -20 "$work/err"; fail "no recovery was reported"; }
grep -q "^result: .* ranks=$((np - 1)) " "$work/out" || fail "the result line does not say ranks=$((np - 1))"
[ -d "$work/ck/step-$total" ] || fail "no final checkpoint step-$total: steps were lost"
echo "PASS: synchronized batch norm went on over the $((np - 1)) survivors to step $total"
