#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# loomrun on one host, no namespaces: NP ranks of PROGRAM with checkpoints every EVERY steps;
# kill -9 of one rank once the first checkpoint is committed. The program runs with --recovery
# off (no in-process recovery: its survivors write an emergency checkpoint and end), so loomrun
# sees every rank fail after mpirun's failure notice and restarts the job on the same host with
# the same NP, from the newest checkpoint; it must end with status 0 and
# weights byte for byte those of a clean run. Then --max-restarts 0 gives up with its message
# and mpirun's non-zero status, and bad arguments exit 2 with theirs. Stand-in mpiruns check how
# loomrun reads the ranks' status files (finished, failed by itself, failed after a peer's
# failure, none).
# usage: loomrun_local.sh LOOMRUN MPIEXEC NP PROGRAM WORKDIR TOTAL EVERY -- flags...
set -u
loomrun=$1 mpiexec=$2 np=$3 program=$4 work=$5 total=$6 every=$7
shift 7
[ "$1" = "--" ] && shift
flags=("$@")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

echo "== bad arguments exit 2 with a message"
check_bad() {  # check_bad EXPECTED-MESSAGE ARGS...
  local want=$1 out status
  shift
  out=$("$loomrun" "$@" 2>&1)
  status=$?
  [ "$status" -eq 2 ] || fail "loomrun $* exited with $status, not 2 ($out)"
  grep -qF -e "$want" <<< "$out" || fail "loomrun $*: expected a message with '$want', found: $out"
  echo "loomrun $*: $(head -1 <<< "$out")"
}
check_bad "missing -- before the program" -np 2 true
check_bad "needs a number of ranks >= 1, not 'x'" -np x -- true
check_bad "unknown option '--frobnicate'" -np 2 --frobnicate -- true
check_bad "cannot read the hostfile '$work/none'" -np 2 --hostfile "$work/none" -- true
check_bad "-np N is required" -- true
check_bad "--log needs a file" -np 2 --log
check_bad "no program" -np 2 --
check_bad "--world-sizes needs world sizes >= 1 separated by commas (or 'ask'), not '0,2'" -np 2 --world-sizes 0,2 -- true
check_bad "-np 3 is not a world size the job trains on (--world-sizes: 2 4)" -np 3 --world-sizes 2,4 -- true
check_bad "--world-sizes ask: 'true --print-valid-world-sizes' ended with status 0 and printed no 'valid_world_sizes: N ...' line" -np 2 --world-sizes ask -- true
"$loomrun" --help | grep -q "^usage: loomrun" || fail "loomrun --help prints no usage"

# standin FILE: a stand-in for mpirun whose job (the run with --enable-recovery) is the script
# on stdin; its host probes succeed.
standin() {
  { printf '%s\n' '#!/usr/bin/env bash' 'job=""' 'for a in "$@"; do [ "$a" = --enable-recovery ] && job=1; done' \
      '[ -n "$job" ] || exit 0  # a host probe'
    cat; } > "$1"
  chmod +x "$1"
}
# run_standin NAME STANDIN: loomrun -np 2 on stand-in mpirun $work/mpirun-STANDIN, its output in
# $work/NAME.out and .err, its lines shown, its exit status in $status.
run_standin() {
  "$loomrun" -np 2 --mpirun "$work/mpirun-$2" -- true > "$work/$1.out" 2> "$work/$1.err"
  status=$?
  grep "^loomrun" "$work/$1.err"
}

echo "== an mpirun that ends with status 1 after the job finished: done, no restart"
# (Seen once under --enable-recovery after the runtime refused a replacement.) A stand-in for
# mpirun: host probes succeed; the job (the one run with --enable-recovery) writes every rank's
# "finished" status and exits 1.
standin "$work/mpirun-status1" <<'FAKE'
for r in 0 1; do echo finished > "$LOOM_STATUS_DIR/rank-$r.status"; done
echo "fake mpirun: the job finished; exiting with status 1" >&2
exit 1
FAKE
run_standin status1 status1
[ "$status" -eq 0 ] || { cat "$work/status1.err"; fail "loomrun ended with status $status after a finished job whose mpirun exited 1"; }
grep -q "^loomrun: restart" "$work/status1.err" && fail "loomrun restarted a finished job"
grep -q "but the job finished" "$work/status1.err" || fail "loomrun did not say why it does not restart"

echo "== Open MPI's runtime ends every process itself (status 0, no rank's status): a restart"
# Seen when a host is lost while mpirun still talks to its daemon (a fence at start-up, and once
# in CI after the first checkpoint): mpirun finds no route to the lost daemon, kills the
# survivors and exits 0. The stand-in prints what Open MPI 4.1.4 printed then; the restart
# (LOOM_RESTART=1) finishes.
standin "$work/mpirun-noroute" <<'FAKE'
if [ "$LOOM_RESTART" = 0 ]; then
  cat >&2 <<'ORTE'
[vm:21917] [[14691,0],0] ACTIVATE JOB [14691,1] STATE RUNNING AT ../../../../../orte/mca/state/base/state_base_fns.c:692
[vm:21917] [[14691,0],0] ACTIVATE PROC [[14691,0],1] STATE COMMUNICATION FAILURE AT ../../../../../../orte/mca/oob/tcp/oob_tcp_component.c:1086
[vm:21917] [[14691,0],0] ACTIVATE PROC [[14691,0],1] STATE NO PATH TO TARGET AT ../../../../../orte/mca/rml/base/rml_base_frame.c:234
--------------------------------------------------------------------------
ORTE does not know how to route a message to the specified daemon
located on the indicated node:

  my node:   vm
  target node:  localhost
--------------------------------------------------------------------------
[vm:21917] [[14691,0],0] ACTIVATE JOB NULL STATE DAEMONS TERMINATED AT ../../../../../../orte/mca/errmgr/default_hnp/errmgr_default_hnp.c:754
ORTE
  exit 0
fi
for r in 0 1; do echo finished > "$LOOM_STATUS_DIR/rank-$r.status"; done
echo "[vm:1] [[2455,0],0] ACTIVATE JOB [2455,1] STATE NORMALLY TERMINATED AT state_base_fns.c:459" >&2
exit 0
FAKE
run_standin noroute noroute
[ "$status" -eq 0 ] || { cat "$work/noroute.err"; fail "loomrun ended with status $status; the restart finished"; }
grep -q "^loomrun: restart 1 of .*Open MPI's runtime ended every process itself (no route to a lost daemon)" "$work/noroute.err" ||
  { cat "$work/noroute.err"; fail "loomrun did not restart (or did not say why) after Open MPI's runtime ended the job with status 0"; }

echo "== every rank fails by itself, and mpirun notices their ends: the program's own error, no restart"
# Seen with the pipeline example restarted on 3 ranks, which it refuses: each rank wrote
# "failed 1", mpirun printed a notice of the first non-zero exit, and loomrun restarted it until
# --max-restarts. With a peer's failure in a status (the process saw one), it is restarted.
standin "$work/mpirun-ownerror" <<'FAKE'
if [ "$LOOM_RESTART" = 0 ]; then
  for r in 0 1; do echo "failed 1$FAKE_SUFFIX" > "$LOOM_STATUS_DIR/rank-$r.status"; done
  echo "mpirun noticed that process rank 0 with PID 1 on node vm exited on signal 6 (Aborted)." >&2
  exit 0
fi
for r in 0 1; do echo finished > "$LOOM_STATUS_DIR/rank-$r.status"; done
exit 0
FAKE
run_standin own ownerror
[ "$status" -eq 1 ] || { cat "$work/own.err"; fail "loomrun ended with status $status after every rank failed by itself, not the program's 1"; }
grep -q "^loomrun: restart" "$work/own.err" && fail "loomrun restarted a job whose every rank failed by itself"
grep -q "none lost and none after a peer's failure: the program's own error, not restarting" "$work/own.err" ||
  fail "loomrun did not say why it does not restart"
FAKE_SUFFIX=" after a peer's failure" run_standin peer ownerror
[ "$status" -eq 0 ] || { cat "$work/peer.err"; fail "loomrun ended with status $status; the restart after a peer's failure finished"; }
grep -q "^loomrun: restart 1 of " "$work/peer.err" || fail "loomrun did not restart a job whose ranks failed after a peer's failure"

echo "== mpirun itself crashes (a signal of its own): named as Open MPI's, restarted from the start"
# What Open MPI 4.1.4's mpirun printed when it segfaulted in its PMIx server as host 1's ranks
# were killed (cluster.dp.ranks_of_live_host, once): its own crash report under its pid, exit 139.
standin "$work/mpirun-crash" <<'FAKE'
if [ "$LOOM_RESTART" = 0 ]; then
  echo "[h0:$$] *** Process received signal ***" >&2
  echo "[h0:$$] Signal: Segmentation fault (11)" >&2
  echo "[h0:$$] [ 2] /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_rml_oob.so(orte_rml_oob_send_buffer_nb+0x375)" >&2
  echo "[h0:$$] *** End of error message ***" >&2
  kill -SEGV $$
fi
for r in 0 1; do echo finished > "$LOOM_STATUS_DIR/rank-$r.status"; done
exit 0
FAKE
run_standin crash crash
[ "$status" -eq 0 ] || { cat "$work/crash.err"; fail "loomrun ended with status $status; the restart after mpirun's crash finished"; }
grep -q "^loomrun: restart 1 of [0-9]*: mpirun itself crashed (Segmentation fault (11)), taking every rank with it: Open MPI's failure, not the job's" "$work/crash.err" ||
  { cat "$work/crash.err"; fail "loomrun did not name mpirun's own crash as the reason of its restart"; }

echo "== a failure recovered in the process, noticed late, and survivors that end without MPI_Finalize: done"
# What Open MPI 4.1.4 printed with host 1's training processes killed and its daemon alive
# (cluster.dp.ranks_of_live_host): one killed rank's notice before the survivors' recovery
# report, the other's and PMIx's after it; the survivors train on past --recovery-timeout, then
# say "finished" and end TERMINATED WITHOUT SYNC; mpirun does not end (it waits for the live
# daemon). loomrun must not take the late notices or the survivors' ends for a failure.
standin "$work/mpirun-late" <<'FAKE'
say() { echo "[h0:1] [[7,0],0] ACTIVATE PROC [[7,1],$1] STATE $2 AT x.c:1" >&2; }
say 2 "ABORTED BY SIGNAL"
echo "loom: recovery 1 at step 21: lost rank 2 (world rank 2, pid 11 on h1), rank 3 (world rank 3, pid 12 on h1); 2 ranks go on (were 4)" >&2
sleep 1
say 3 "ABORTED BY SIGNAL"
echo "[h0:1] PMIX ERROR: BAD-PARAM in file ../../../src/event/pmix_event_notification.c at line 1033" >&2
sleep 4  # the survivors train on, past --recovery-timeout 2
for r in 0 1; do echo finished > "$LOOM_STATUS_DIR/rank-$r.status"; say $r "TERMINATED WITHOUT SYNC"; done
echo "[h0:1] PMIX ERROR: BAD-PARAM in file ../../../src/event/pmix_event_notification.c at line 1033" >&2
sleep 120  # waits for the live daemon; loomrun stops it
FAKE
"$loomrun" -np 4 --max-restarts 0 --recovery-timeout 2 --log "$work/late.log" --mpirun "$work/mpirun-late" -- true > "$work/late.out" 2> "$work/late.err"
status=$?
grep "^loomrun" "$work/late.err"
[ "$status" -eq 0 ] || { cat "$work/late.err"; fail "loomrun ended with status $status: it took a recovered job for a failed one"; }
# --log keeps what loomrun read: the state machine's lines (not passed through to stderr) and
# the ranks' statuses.
grep -q "ACTIVATE PROC \[\[7,1\],2\] STATE ABORTED BY SIGNAL" "$work/late.log" || fail "--log: no state-machine line in $work/late.log"
grep -q "^== loomrun: rank-0.status: finished" "$work/late.log" || fail "--log: no rank status in $work/late.log"
grep -q "^== loomrun: attempt 1 (4 ranks" "$work/late.log" || fail "--log: no attempt header in $work/late.log"
grep -q "ACTIVATE PROC" "$work/late.err" && fail "the state machine's lines reached stderr"
grep -q "no in-process recovery" "$work/late.err" && fail "loomrun stopped a job that had recovered in the process"
grep -q "^loomrun: the ranks finished but mpirun did not end" "$work/late.err" || fail "loomrun did not say why it stopped mpirun"

echo "== a program that is not loom's (no status files) and ends normally: done, no restart"
"$loomrun" -np 2 --mpirun "$mpiexec" --mpirun-arg --oversubscribe -- true > "$work/true.out" 2> "$work/true.err"
status=$?
[ "$status" -eq 0 ] || { cat "$work/true.err"; fail "loomrun -- true ended with status $status"; }
grep -q "^loomrun: restart" "$work/true.err" && { cat "$work/true.err"; fail "loomrun restarted a job that ended normally"; }

echo "== the clean run ($np ranks, plain mpirun)"
"$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$program" "${flags[@]}" --max-steps "$total" \
  --save-weights "$work/full.safetensors" > "$work/full.out" 2> "$work/full.err" || { cat "$work/full.err"; fail "the clean run failed"; }
tail -1 "$work/full.out"

run_killed() {  # run_killed NAME LOOMRUN-FLAGS...: loomrun's run, one rank killed after the first checkpoint
  local name=$1 rank
  shift
  (exec "$loomrun" -np "$np" "$@" -- "$program" "${flags[@]}" --recovery off --max-steps "$total" --checkpoint-dir "$work/$name.ck" \
     --checkpoint-every "$every" --save-weights "$work/$name.safetensors" > "$work/$name.out" 2> "$work/$name.err") &
  job=$!
  for _ in $(seq 1 6000); do
    [ -d "$work/$name.ck/step-$every" ] && break
    kill -0 $job 2> /dev/null || break
    sleep 0.01
  done
  [ -d "$work/$name.ck/step-$every" ] || { cat "$work/$name.err"; fail "no checkpoint step-$every appeared"; }
  # Only this job's ranks: the children of the mpirun that this loomrun started (never a
  # process of the same name elsewhere on the machine).
  local mp
  mp=$(pgrep -P "$job" -x mpirun | head -1)
  [ -n "$mp" ] || fail "found no mpirun under loomrun ($job)"
  rank=$(pgrep -P "$mp" -x "$(basename "$program" | cut -c1-15)" | tail -1)
  [ -n "$rank" ] || fail "found no rank process of $program under mpirun ($mp)"
  killed_at=$(date +%s.%N)
  kill -9 "$rank"
  echo "kill -9 of rank process $rank after step-$every's checkpoint"
}

echo "== loomrun, one rank killed: restarted from the checkpoint"
run_killed restarted --recovery-timeout 10
for _ in $(seq 1 3000); do grep -q "resumed from" "$work/restarted.err" && break; sleep 0.05; done
resumed_at=$(date +%s.%N)
wait $job
status=$?
cat "$work/restarted.err" | grep -E "^loomrun|resumed from|PMIX|exited on"
[ "$status" -eq 0 ] || fail "loomrun ended with status $status, not 0"
grep -q "^loomrun: restart 1 of 3: .*, $np ranks on localhost, from the newest checkpoint" "$work/restarted.err" ||
  fail "loomrun did not report 'restart 1 of 3: ..., $np ranks on localhost, from the newest checkpoint'"
grep -q "resumed from" "$work/restarted.err" || fail "the restarted job did not say where it resumed from"
grep "result: .* ranks=$np " "$work/restarted.out" || fail "no result line with ranks=$np"
echo "restart time (kill -9 -> the restarted job resumed): $(awk "BEGIN { printf \"%.2f\", $resumed_at - $killed_at }") s (includes --recovery-timeout 10)"
cmp "$work/full.safetensors" "$work/restarted.safetensors" || fail "the restarted run's weights differ from the clean run's"
echo "the restarted run's weights are bitwise the clean run's"

echo "== loomrun --max-restarts 0, one rank killed: gives up"
run_killed norestart --max-restarts 0 --recovery-timeout 5
wait $job
status=$?
grep "^loomrun" "$work/norestart.err"
[ "$status" -ne 0 ] || fail "loomrun --max-restarts 0 ended with status 0 after a rank was killed"
grep -q "^loomrun: giving up after 0 restart(s) (--max-restarts 0): .*mpirun's exit status $status" "$work/norestart.err" ||
  fail "no 'giving up after 0 restart(s) (--max-restarts 0): ... mpirun's exit status $status' message"
grep -q "^loomrun: restart" "$work/norestart.err" && fail "loomrun restarted with --max-restarts 0"
echo "PASS: loomrun restarted the killed job to the clean run's weights, gave up with --max-restarts 0, refused bad arguments, and took a finished job whose mpirun exited 1 as done"
rm -rf "$work"
