#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# In-process recovery on a hybrid's data-parallel axis (docs/fault-tolerance.md, "Hybrids"):
# PROGRAM on 4 ranks is 2 model replicas of 2 ranks each (ranks 0-1 and 2-3) under
# `mpirun --enable-recovery`: examples/tensor_parallel (loom::hybrid<data_parallel,
# tensor_parallel<2>>), or examples/pipeline with --stages 2 among the flags (loom::hybrid<
# data_parallel, pipeline<2>>); on 2 ranks the same flags run the one replica. Modes:
#   kill    per trial, kill -9 of a random rank (rank 0 included) a random moment after the first
#           checkpoint. Requires: exit status 0; the `result:` line says ranks=2; the report
#           "loom: recovery 1 at step X" names the killed process as lost and the other rank of its
#           replica as leaving with it (which says so itself); and the final weights are byte for
#           byte those of the run that lost nothing up to step X and went on from there on 2 ranks
#           (4 ranks to step X with a checkpoint, resumed from it on 2 ranks): no step lost, none
#           taken twice, nothing of the lost replica left in the state; and a checkpoint written
#           after the recovery, resumed on 2 ranks, ends with the same weights.
#   commit  the case the step commit exists for, made certain by a test hook
#           (LOOM_TEST_COMMIT_FAULT=S:D:L): at step S, after every rank completed the step commit,
#           rank D dies before it steps and rank L (the other replica) takes its commit for failed,
#           so that L is a step behind its replica's other rank. Requires as kill, plus L's line
#           "finished step S+1 from its reduced gradients".
#   both    kill -9 of one rank of each replica at once: no replica is whole, so the job must end
#           by itself (no hang), the survivors' status files saying "failed 1 after a peer's
#           failure" (what loomrun restarts from the newest checkpoint), the message "every model
#           replica lost a rank", and no process of it left.
# usage: hybrid_recovery.sh MODE MPIEXEC PROGRAM WORKDIR TRIALS TOTAL -- flags...
set -u
mode=$1 mpiexec=$2 program=$3 work=$4 trials=$5 total=$6
shift 6
[ "$1" = "--" ] && shift
flags=("$@")
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/common.sh"
every=100
rank_of() { tr '\0' '\n' < "/proc/$1/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }
# pids_by_rank JOB: the 4 rank processes of mpirun JOB, indexed by MPI rank.
pids_by_rank() {
  local p
  pids=()
  for p in $(pgrep -P "$1"); do pids[$(rank_of "$p")]=$p; done
  [ "${#pids[@]}" -eq 4 ] || fail "found ${#pids[@]} rank processes of mpirun $1, expected 4"
}
# wait_for_checkpoint DIR JOB: until DIR/ck/step-$every exists (the run is in its stride).
wait_for_checkpoint() {
  for _ in $(seq 1 3000); do [ -d "$1/ck/step-$every" ] && return; kill -0 "$2" 2> /dev/null || break; sleep 0.01; done
  cat "$1/err"; fail "no checkpoint step-$every appeared"
}
# reference DIR X: the run that lost nothing: 4 ranks to step X (checkpoint), resumed on 2 ranks.
reference() {
  local d=$1 x=$2
  "${mpi[@]}" -np 4 "$program" "${flags[@]}" --max-steps "$x" --checkpoint-dir "$d/ref" > "$d/ref4.out" 2> "$d/ref4.err" ||
    { cat "$d/ref4.err"; fail "the reference run on 4 ranks to step $x failed"; }
  "${mpi[@]}" -np 2 "$program" "${flags[@]}" --max-steps "$total" --checkpoint-dir "$d/ref" --resume \
    --save-weights "$d/ref.safetensors" > "$d/ref2.out" 2> "$d/ref2.err" ||
    { cat "$d/ref2.err"; fail "the reference run resumed on 2 ranks from step $x failed"; }
}
# check_recovered DIR VICTIM: the checks of kill and commit (see above).
check_recovered() {
  local d=$1 victim=$2 status=$3 x partner
  [ "$status" -eq 0 ] || { cat "$d/err"; fail "the run ended with status $status"; }
  grep -q "^result: .* ranks=2 " "$d/out" || { cat "$d/out" "$d/err"; fail "the result line does not say ranks=2"; }
  grep -m1 "^loom: recovery 1 at step" "$d/err" | cut -c1-400
  grep -q "^loom: recovery 1 at step [0-9]*: lost rank $victim (world rank $victim, pid ${pids[$victim]} on " "$d/err" ||
    { cat "$d/err"; fail "the recovery report does not name rank $victim (pid ${pids[$victim]}) as lost"; }
  partner=$((victim ^ 1))
  grep -q "^loom: recovery 1 at step .*left with their replica, which lost a rank: rank $partner " "$d/err" ||
    { cat "$d/err"; fail "the report does not say rank $partner left with its replica"; }
  grep -q "^loom: recovery 1: rank $partner leaves the job with its model replica, which lost rank $victim " "$d/err" ||
    { cat "$d/err"; fail "rank $partner did not say it leaves with its replica"; }
  x=$(sed -n 's/^loom: recovery 1 at step \([0-9]*\):.*/\1/p' "$d/err" | head -1)
  reference "$d" "$x"
  cmp "$d/a.safetensors" "$d/ref.safetensors" ||
    fail "the recovered run's weights differ from the run that lost nothing up to step $x and went on on 2 ranks"
  # A checkpoint written after the recovery holds the state exactly: resumed from it on 2 ranks,
  # the run ends with the same weights.
  last=$(ls "$d/ck" | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | awk -v x="$x" -v t="$total" '$1 > x && $1 < t' | tail -1)
  if [ -n "$last" ]; then
    mkdir -p "$d/after" && cp -r "$d/ck/step-$last" "$d/after/"
    "${mpi[@]}" -np 2 "$program" "${flags[@]}" --max-steps "$total" --checkpoint-dir "$d/after" --resume \
      --save-weights "$d/after.safetensors" > "$d/after.out" 2> "$d/after.err" ||
      { cat "$d/after.err"; fail "resuming from step-$last, written after the recovery, failed"; }
    cmp "$d/a.safetensors" "$d/after.safetensors" ||
      fail "resumed from step-$last (written after the recovery), the run ends with other weights"
  fi
  echo "recovered at step $x; weights byte for byte the reference's${last:+ (also resumed from step-$last)}; $(sed -n 's/.*\(test_accuracy=[0-9.]*\).*/\1/p' "$d/out")"
}

case $mode in
  kill | commit)
    for t in $(seq 1 "$trials"); do
      d=$work/trial-$t && mkdir -p "$d"
      hook=()
      if [ "$mode" = commit ]; then
        s=$((300 + RANDOM % (total / 2))) victim=$((RANDOM % 4))
        lagging=$(( (victim < 2 ? 2 : 0) + RANDOM % 2 ))
        hook=(-x "LOOM_TEST_COMMIT_FAULT=$s:$victim:$lagging")
      fi
      (exec "${mpi[@]}" --enable-recovery "${hook[@]}" -np 4 "$program" "${flags[@]}" --max-steps "$total" \
         --checkpoint-dir "$d/ck" --checkpoint-every $every --save-weights "$d/a.safetensors" > "$d/out" 2> "$d/err") &
      job=$!
      wait_for_checkpoint "$d" $job
      pids_by_rank $job
      if [ "$mode" = kill ]; then
        sleep "0.$((RANDOM % 9 + 1))"
        victim=$((RANDOM % 4))
        kill -9 "${pids[$victim]}"
        killed_at=$(now)
        echo "trial $t: kill -9 of rank $victim (pid ${pids[$victim]})"
      else
        echo "trial $t: LOOM_TEST_COMMIT_FAULT=$s:$victim:$lagging (rank $victim dies after the commit of step $s, rank $lagging takes it for failed)"
      fi
      wait $job
      check_recovered "$d" "$victim" $?
      if [ "$mode" = kill ]; then
        good=$(sed -n 's/^loom: recovery: first good step .*(unix time \([0-9.]*\)).*/\1/p' "$d/err" | head -1)
        [ -n "$good" ] || { cat "$d/err"; fail "no 'first good step' line"; }
        took=$(awk "BEGIN { printf \"%.3f\", $good - $killed_at }")
        echo "kill -9 -> first good step: $took s"
        echo "$took" >> "$work/first_good_step.txt"
      fi
      if [ "$mode" = commit ]; then
        grep -m1 "^loom: recovery 1: rank [0-9]* (was $lagging) finished step $((s + 1)) from its reduced gradients" "$d/err" ||
          { cat "$d/err"; fail "rank $lagging did not finish step $((s + 1)) from its reduced gradients"; }
      fi
    done
    if [ "$mode" = kill ]; then
      echo "kill -9 -> first good step over $trials trial(s): median $(sort -g "$work/first_good_step.txt" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') s, max $(sort -g "$work/first_good_step.txt" | tail -1) s"
    fi
    echo "PASS: $trials trial(s) of $mode: the hybrid went on with its whole replica, to the weights of the run that lost nothing"
    ;;
  both)
    d=$work/both && mkdir -p "$d"
    mkdir -p "$d/status"
    (exec "${mpi[@]}" --enable-recovery -x "LOOM_STATUS_DIR=$d/status" -np 4 "$program" "${flags[@]}" --max-steps "$total" \
       --checkpoint-dir "$d/ck" --checkpoint-every $every > "$d/out" 2> "$d/err") &
    job=$!
    wait_for_checkpoint "$d" $job
    pids_by_rank $job
    sleep "0.$((RANDOM % 5 + 1))"
    a=$((RANDOM % 2)) b=$((2 + RANDOM % 2))
    kill -9 "${pids[$a]}" "${pids[$b]}"
    killed_at=$(now)
    echo "kill -9 of ranks $a and $b (one of each replica)"
    for _ in $(seq 1 600); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
    if kill -0 $job 2> /dev/null; then
      kill -9 $job "${pids[@]}" 2> /dev/null; fail "the job did not end within 60 s of losing a rank of each replica"
    fi
    wait $job
    status=$?
    echo "mpirun ended with status $status, $(awk "BEGIN { printf \"%.2f\", $(now) - $killed_at }") s after the kills"
    # (mpirun --enable-recovery's own status does not tell; loomrun reads the ranks' status files.)
    for r in 0 1 2 3; do
      [ "$r" -eq "$a" ] || [ "$r" -eq "$b" ] || grep -qx "failed 1 after a peer's failure" "$d/status/rank-$r.status" ||
        { cat "$d/err" "$d/status"/*; fail "rank $r's status file does not say 'failed 1 after a peer's failure'"; }
    done
    grep -m1 "every model replica lost a rank and none is whole; the job ends" "$d/err" | cut -c1-300 ||
      { cat "$d/err"; fail "no survivor said every model replica lost a rank"; }
    for p in "${pids[@]}"; do
      ! ps -o stat= -p "$p" | grep -qv Z || fail "process $p of the job outlived it"
    done
    echo "PASS: losing a rank of each replica ended the job by itself, saying why"
    ;;
  *) fail "unknown mode $mode (kill, commit, both)" ;;
esac
