#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The pipeline example, 2 stages on 2 hosts (one each), under loomrun with a checkpoint every
# EVERY steps; once the first checkpoint is committed, every process of host 1 is killed (kill -9:
# a host failure). loomrun must report the restart, exclude host 1, restart on host 0 with 2
# ranks from the newest checkpoint, and finish with status 0 and weights byte for byte those of
# an uninterrupted run. Prints what Open MPI printed and the restart time.
# usage: pipeline_host_failure.sh LOOMRUN PROGRAM TOTAL EVERY -- flags...
set -u
here=$(cd "$(dirname "$0")" && pwd)
loomrun=$1 program=$2 total=$3 every=$4
shift 4
[ "$1" = "--" ] && shift
flags=("$@")
source "$here/harness.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_up 2
cluster_hostfile "$CLUSTER_DIR/hosts" 2
w=$CLUSTER_DIR
through=()
for a in "${CLUSTER_MCA[@]}" --map-by node; do through+=(--mpirun-arg "$a"); done

echo "== the uninterrupted run (2 ranks on one host, plain mpirun)"
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$program" "${flags[@]}" --max-steps "$total" \
  --save-weights "$w/full.safetensors" > "$w/full.out" 2> "$w/full.err" || { cat "$w/full.err"; fail "the uninterrupted run failed"; }
grep "^result:" "$w/full.out"

echo "== loomrun across 2 hosts, host 1 killed after step-$every's checkpoint"
(cluster_exec 0 "$loomrun" -np 2 --hostfile "$w/hosts" --recovery-timeout 10 "${through[@]}" -- \
   "$program" "${flags[@]}" --max-steps "$total" --checkpoint-dir "$w/ck" --checkpoint-every "$every" \
   --save-weights "$w/resumed.safetensors" > "$w/run.out" 2> "$w/run.err") &
job=$!
cluster_wait_for "$w/ck/step-$every" $job || { cat "$w/run.err"; fail "no checkpoint step-$every appeared"; }
ip netns pids "$(cluster_ns 1)" | xargs -r ps -o pid=,args= -p | cut -c1-60 | sed 's/^/host 1: /'
killed_at=$(date +%s.%N)
n=$(cluster_kill_host 1)
echo "kill -9 of the $n processes of host 1"
for _ in $(seq 1 3000); do grep -q "resumed from" "$w/run.err" && break; kill -0 $job 2> /dev/null || break; sleep 0.05; done
resumed_at=$(date +%s.%N)
wait $job
status=$?
echo "--- what Open MPI and loomrun printed on stderr"
grep -v "^ *$" "$w/run.err" | grep -v "^loom: step" | head -40
echo "---"
[ "$status" -eq 0 ] || fail "loomrun ended with status $status, not 0"
grep -q "^loomrun: restart 1 of 3: .*2 ranks on $(cluster_addr 0) (excluded: $(cluster_addr 1) (.*)), from the newest checkpoint" "$w/run.err" ||
  fail "loomrun did not report 'restart 1 of 3: ..., 2 ranks on $(cluster_addr 0) (excluded: $(cluster_addr 1) (...)), from the newest checkpoint'"
grep "resumed from" "$w/run.err" || fail "the restarted job did not say where it resumed from"
newest=$(grep -o "resumed from [^ ]*step-[0-9]*" "$w/run.err" | sed 's/.*step-//')
[ "$newest" -lt "$total" ] || fail "the restarted job resumed at the end: nothing was tested"
grep "^result: .* ranks=2 " "$w/run.out" || fail "no result line with ranks=2"
echo "restart time (kill -9 of host 1 -> the restarted job resumed): $(awk "BEGIN { printf \"%.2f\", $resumed_at - $killed_at }") s (includes --recovery-timeout 10)"
cmp "$w/full.safetensors" "$w/resumed.safetensors" || fail "the restarted run's weights differ from the uninterrupted run's"
echo "PASS: host 1 excluded, restarted on host 0 from step-$newest, weights bitwise the uninterrupted run's"
