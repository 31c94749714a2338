#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# loomrun --world-sizes ask: a restart takes the largest world size the job trains on within the
# slots left. The pipeline example (one stage per rank: 2 or 4 stages, `--print-valid-world-sizes`
# says "2 4") on 4 ranks of 3 hosts (2 + 1 + 1 slots); once the first checkpoint is committed,
# host 2 is killed (kill -9). 3 slots are left: loomrun must restart on 2 ranks (on 3, the old
# rule min(N, slots left), the program refuses to start), from the checkpoint resharded from 4
# stages to 2, and finish with status 0 and ranks=2. A list that fits no slot count left makes
# loomrun give up with a message that says so.
# usage: loomrun_world_sizes.sh LOOMRUN PROGRAM TOTAL EVERY -- flags...
set -u
here=$(cd "$(dirname "$0")" && pwd)
loomrun=$1 program=$2 total=$3 every=$4
shift 4
[ "$1" = "--" ] && shift
flags=("$@")
source "$here/harness.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_up 3
w=$CLUSTER_DIR
printf '%s slots=2\n%s slots=1\n%s slots=1\n' "$(cluster_addr 0)" "$(cluster_addr 1)" "$(cluster_addr 2)" > "$w/hosts"
through=()
for a in "${CLUSTER_MCA[@]}"; do through+=(--mpirun-arg "$a"); done
# run_losing_host2 NAME WORLD-SIZES: loomrun's job (stdout NAME.out, stderr NAME.err, checkpoints
# NAME.ck); host 2 killed once the first checkpoint is committed. Sets status to loomrun's.
run_losing_host2() {
  local name=$1 sizes=$2 job n
  (cluster_exec 0 "$loomrun" -np 4 --hostfile "$w/hosts" --world-sizes "$sizes" --recovery-timeout 10 "${through[@]}" -- \
     "$program" "${flags[@]}" --max-steps "$total" --checkpoint-dir "$w/$name.ck" --checkpoint-every "$every" \
     > "$w/$name.out" 2> "$w/$name.err") &
  job=$!
  cluster_wait_for "$w/$name.ck/step-$every" $job || { cat "$w/$name.err"; fail "$name: no checkpoint step-$every appeared"; }
  n=$(cluster_kill_host 2)
  echo "$name: kill -9 of the $n processes of host 2 after step-$every's checkpoint"
  wait $job
  status=$?
}
run_losing_host2 run ask
grep -E "^loomrun|resumed from" "$w/run.err"
[ "$status" -eq 0 ] || { tail -20 "$w/run.err"; fail "loomrun ended with status $status, not 0"; }
grep -q "^loomrun: restart 1 of 3: .*, 2 ranks (the largest world size the job trains on within 3 slot(s)) on $(cluster_addr 0) $(cluster_addr 1) (excluded: $(cluster_addr 2) (.*)), from the newest checkpoint" "$w/run.err" ||
  fail "loomrun did not restart on 2 ranks, the largest world size within the 3 slots left"
grep -q "^loom: resumed from [^ ]*step-[0-9]*" "$w/run.err" || fail "the restarted job did not resume from a checkpoint"
grep "^result: .* ranks=2 " "$w/run.out" || fail "no result line with ranks=2"

echo "== a list that no slot count left fits: loomrun gives up and says why"
run_losing_host2 none 4
grep "^loomrun: giving up" "$w/none.err"
[ "$status" -ne 0 ] || fail "loomrun ended with status 0 although no world size fits"
grep -q "^loomrun: giving up: .*0 rank(s) left on the hosts that remain .*(no world size the job trains on (4) fits in 3 slot(s)), fewer than --min-ranks 1" "$w/none.err" ||
  fail "loomrun did not say that no world size the job trains on fits in the 3 slots left"
echo "PASS: host 2 lost; loomrun restarted on 2 ranks (the largest world size within 3 slots) from the checkpoint, resharded from 4 stages, and finished; with --world-sizes 4 it gave up and said why"
