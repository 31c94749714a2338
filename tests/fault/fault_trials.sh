#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Training that goes on when a rank dies or hangs (docs/fault-tolerance.md), with real mpirun
# processes and real signals. Every trial runs NP ranks of PROGRAM under
# `mpirun --enable-recovery`, waits until its first checkpoint is committed (the run is in its
# stride), waits a random moment more (so the failure lands in forward, backward, a bucket's
# allreduce, the optimizer step or a checkpoint write), and then:
#   kill   kill -9 of a random rank (rank 0 included);
#   stop   SIGSTOP of a random rank (a hang: the roll call must name it);
#   twice  kill -9 of a random rank, and of another one a second after the first recovery;
#   during kill -9 of a random rank, and of another 0.05 s later, while the survivors detect the
#          first failure (both are left out, by one verdict or by the next round's). A second
#          death after the round decided to rebuild and before MPI_Comm_create_group finished
#          blocks the rebuild: then every survivor must end with status 75 (the rebuild watchdog,
#          for the launcher's restart; docs/fault-tolerance.md, Limits) — never a live rank left
#          out — and at least one trial must recover in the process;
# and requires: exit status 0; the `result:` line says ranks=NP-1 (NP-2 for twice and during);
# stderr reports each recovery (`loom: recovery N`), naming the lost rank, and for stop the
# roll call's "did not answer"; the run took every step it was asked for (its final checkpoint
# is step-TOTAL: nothing skipped) — at most the step in flight is computed again; and its test
# accuracy is within 0.5 points of the same run without a failure. Prints every trial's time
# from the signal to the first good step after it (the distribution's median and maximum).
#
#   bitwise  kill as above, with --deterministic-chunk among the flags: the weights at the end are
#          byte for byte those of the run without a failure (the split-invariant sum is the same on
#          N and N-1 ranks, and the interrupted step is computed again from the same state);
#          Any mode whose flags hold --deterministic-chunk checks the same.
#   replace  kill as above, with --replace-failed among the flags: the survivors start a new
#          process for the lost rank and go on with NP ranks again. Requires as kill (ranks=NP
#          now), plus the replacement's report ("loom: replacement after recovery N ... replaced
#          rank R ... by rank ..." and its first good step), a status file "finished" from every
#          rank (the replacement's too: LOOM_STATUS_DIR), and, under --deterministic-chunk, the
#          clean run's weights byte for byte. Prints spawn, merge and signal -> first good step.
#   replace-again  replace, and once the replacement has taken its first good step, kill -9 of
#          the replacement itself: a second recovery and a second replacement; requires as replace,
#          with both replacement reports (the second naming "a replacement" as the rank lost).
#          Prints the run's samples/s against the clean run's (without the TCP progress tick that
#          a replacement sets as it joins, training after the second replacement was ~30 times
#          slower: docs/fault-tolerance.md, "Open MPI's TCP progress after a death").
#   refused  replace, with the runtime refusing the new process (LOOM_REPLACE_HOST names a host
#          outside the allocation): the survivors say why and go on with NP-1 ranks, each
#          finished ("finished" status files; mpirun itself then exits with status 1, which is
#          not asserted).
#   foreign  replace, with the new process given another seed (LOOM_REPLACE_EXTRA_ARG=--seed=7):
#          it names the field that differs and leaves; the survivors go on with NP-1 ranks.
#   plain  plain mpirun (no recovery: it kills the survivors a second after a rank dies), kill -9
#          of one rank: a survivor writes an emergency checkpoint of the last step it finished,
#          newer than the last periodic one, and a run resumed from it ends with the weights, byte
#          for byte, of the run that never failed.
#
# usage: fault_trials.sh MODE MPIEXEC NP PROGRAM WORKDIR TRIALS TOTAL -- flags...
set -u
mode=$1 mpiexec=$2 np=$3 program=$4 work=$5 trials=$6 total=$7
shift 7
[ "$1" = "--" ] && shift
flags=("$@" --max-steps "$total")
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/common.sh"
accuracy() { sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$1" | tail -1; }
ranks_of() {  # the rank processes of mpirun $1, in start order
  local kids
  kids=$(pgrep -P "$1" | sort -n)
  echo "$kids"
}

if [ "$mode" = plain ]; then
  every=200
  echo "== the uninterrupted run"
  "${mpi[@]}" -np "$np" "$program" "${flags[@]}" --save-weights "$work/full.safetensors" > "$work/full.out" 2> "$work/full.err" ||
    { cat "$work/full.err"; fail "the uninterrupted run failed"; }
  echo "== the run killed after its first checkpoint (plain mpirun)"
  (exec "${mpi[@]}" -np "$np" "$program" "${flags[@]}" --checkpoint-dir "$work/ck" --checkpoint-every $every \
     > "$work/killed.out" 2> "$work/killed.err") &
  job=$!
  for _ in $(seq 1 3000); do [ -d "$work/ck/step-$every" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
  [ -d "$work/ck/step-$every" ] || { cat "$work/killed.err"; fail "no checkpoint step-$every appeared"; }
  sleep 0.$((RANDOM % 6 + 2))
  victim=$(ranks_of $job | head -1)
  kill -9 "$victim"
  wait $job
  status=$?
  echo "the job ended with status $status"
  [ "$status" -ne 0 ] || fail "the killed job under plain mpirun ended with status 0"
  grep "emergency checkpoint" "$work/killed.err" || { cat "$work/killed.err"; fail "no survivor wrote an emergency checkpoint"; }
  newest=$(ls "$work/ck" | grep -E '^step-[0-9]+$' | sed 's/step-//' | sort -n | tail -1)
  echo "newest committed checkpoint: step-$newest (periodic ones every $every)"
  [ "$newest" -gt "$every" ] || fail "the newest checkpoint is the periodic step-$every: the emergency one is missing"
  [ "$newest" -lt "$total" ] || fail "the run reached its end before the kill: nothing was tested"
  echo "== the run resumed from it"
  "${mpi[@]}" -np "$np" "$program" "${flags[@]}" --checkpoint-dir "$work/ck" --resume --save-weights "$work/resumed.safetensors" \
    > "$work/resumed.out" 2> "$work/resumed.err" || { cat "$work/resumed.err"; fail "the resumed run failed"; }
  grep "resumed from" "$work/resumed.err" | head -1
  cmp "$work/full.safetensors" "$work/resumed.safetensors" || fail "the resumed run's weights differ from the uninterrupted run's"
  echo "PASS: the emergency checkpoint of step $newest lost no step; resumed, the weights are byte for byte the uninterrupted run's"
  exit 0
fi

expect=$((np - 1))
[ "$mode" = twice ] || [ "$mode" = during ] && expect=$((np - 2))
[ "$mode" = replace ] || [ "$mode" = replace-again ] && expect=$np
case $mode in
  refused) export LOOM_REPLACE_HOST=no-such-host.invalid ;;
  foreign) export LOOM_REPLACE_EXTRA_ARG=--seed=7 ;;
esac
replacing=""
case $mode in replace|replace-again|refused|foreign) replacing=1 ;; esac
echo "== the run without a failure ($np ranks)"
"${mpi[@]}" --enable-recovery -np "$np" "$program" "${flags[@]}" --save-weights "$work/clean.safetensors" \
  > "$work/clean.out" 2> "$work/clean.err" ||
  { cat "$work/clean.err"; fail "the clean run failed"; }
clean=$(accuracy "$work/clean.out")
[ -n "$clean" ] || { cat "$work/clean.out"; fail "the clean run printed no result line"; }
echo "clean test accuracy $clean"
times=()
windowed=0
for t in $(seq 1 "$trials"); do
  d="$work/trial$t"
  mkdir -p "$d"
  mkdir -p "$d/status"
  (export LOOM_STATUS_DIR="$d/status"
   exec "${mpi[@]}" --enable-recovery -x LOOM_STATUS_DIR -np "$np" "$program" "${flags[@]}" --checkpoint-dir "$d/ck" --checkpoint-every 50 \
     --save-weights "$d/weights.safetensors" > "$d/out" 2> "$d/err") &
  job=$!
  for _ in $(seq 1 6000); do [ -d "$d/ck/step-50" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
  [ -d "$d/ck/step-50" ] || { cat "$d/err"; fail "trial $t: no first checkpoint appeared"; }
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", r / 32767 * 1.5 }')"
  mapfile -t pids < <(ranks_of $job)
  [ "${#pids[@]}" -eq "$np" ] || fail "trial $t: found ${#pids[@]} rank processes under mpirun, expected $np"
  i=$((RANDOM % np))
  case $mode in
    kill|twice|during|bitwise|replace|replace-again|refused|foreign) kill -9 "${pids[$i]}"; what="kill -9" ;;
    stop) kill -STOP "${pids[$i]}"; what="SIGSTOP" ;;
  esac
  at=$(now)
  echo "trial $t: $what of the rank process ${pids[$i]} (index $i of $np) at $at"
  if [ "$mode" = during ]; then
    sleep 0.05
    j=$(((i + 1 + RANDOM % (np - 1)) % np))
    kill -9 "${pids[$j]}"
    echo "trial $t: kill -9 of ${pids[$j]} (index $j) during the detection of the first"
  fi
  if [ "$mode" = twice ]; then
    for _ in $(seq 1 3000); do grep -q "first good step" "$d/err" && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
    sleep 1
    j=$(((i + 1 + RANDOM % (np - 1)) % np))
    kill -9 "${pids[$j]}"
    echo "trial $t: kill -9 of ${pids[$j]} (index $j) after the first recovery"
  fi
  if [ "$mode" = replace-again ]; then
    for _ in $(seq 1 3000); do grep -q "^loom: replacement: first good step" "$d/err" && break; kill -0 $job 2>/dev/null || break; sleep 0.01; done
    sleep 0.3
    newcomer=$(sed -n 's/^loom: replacement: this process (pid \([0-9]*\) on .*/\1/p' "$d/err" | head -1)
    [ -n "$newcomer" ] || { cat "$d/err"; fail "trial $t: no replacement joined after the first kill"; }
    kill -9 "$newcomer" || { cat "$d/err"; fail "trial $t: the replacement (pid $newcomer) was gone before its kill: the run ended too soon"; }
    echo "trial $t: kill -9 of the replacement (pid $newcomer) after its first good step"
  fi
  wait $job
  status=$?
  if [ "$mode" != refused ]; then
    [ "$status" -eq 0 ] || { cat "$d/err"; fail "trial $t: the job ended with status $status, not 0"; }
  fi
  if [ -n "$replacing" ]; then
    # How every process ended, the replacement's included (its own file: rank-replacement-<pid>).
    statuses=$(cd "$d/status" && grep -H . rank-*.status 2> /dev/null | tr '\n' ' ')
    echo "trial $t: status files: $statuses"
    want=$expect
    [ "$mode" = foreign ] && want=$((np - 1))
    finished=$(cat "$d/status"/rank-*.status 2> /dev/null | grep -cx finished)
    [ "$finished" -eq "$want" ] || { cat "$d/err"; fail "trial $t: $finished processes say finished, expected $want ($statuses)"; }
  fi
  if [ "$mode" = during ] && ! grep -q "ranks=$expect " "$d/out" &&
     grep -q "did not finish within .*ending this process (status 75)" "$d/err"; then
    # The one documented way out (docs/fault-tolerance.md, Limits): the second rank died after
    # the round decided to rebuild and before MPI_Comm_create_group finished, which it blocks;
    # the watchdog ends every survivor with status 75, for the launcher to restart the job from
    # its checkpoint. Never a live rank left out: every status file must say "failed 75" (after
    # a peer's failure, which each of them saw).
    n75=$(cat "$d/status"/rank-*.status 2> /dev/null | grep -cx "failed 75 after a peer's failure")
    nall=$(ls "$d/status"/rank-*.status 2> /dev/null | wc -l)
    { [ "$n75" -eq "$expect" ] && [ "$nall" -eq "$expect" ]; } ||
      { cat "$d/err"; fail "trial $t: the rebuild watchdog ended the job, but $n75 of $nall status files say 'failed 75 after a peer's failure' (expected $expect of $expect)"; }
    echo "trial $t: the second failure landed in the rebuild: every survivor ended with status 75 (the documented window; loomrun restarts from the checkpoint)"
    windowed=$((windowed + 1))
    continue
  fi
  case $mode in
    replace|replace-again)
      grep "^loom: replacement" "$d/err"
      grep -q "^loom: replacement after recovery [0-9]* at step [0-9]*: replaced rank [0-9]* (world rank [0-9]*, pid [0-9]* on [^)]*) by rank $((np - 1)) (pid [0-9]* on " "$d/err" ||
        { cat "$d/err"; fail "trial $t: no replacement report naming the lost rank and its replacement"; }
      grep -q "^loom: replacement: first good step ([0-9]*) on $np ranks done" "$d/err" ||
        { cat "$d/err"; fail "trial $t: no first good step on $np ranks after the replacement"; }
      ls "$d/status"/rank-replacement-*.status > /dev/null 2>&1 || fail "trial $t: the replacement process wrote no status file"
      grep -q "^loom: replacement: this process (pid [0-9]* on [^)]*) joined as rank $((np - 1)) of $np" "$d/err" ||
        { cat "$d/err"; fail "trial $t: the replacement did not report its joining"; }
      spawn=$(sed -n 's/.*; spawn \([0-9.]*\) s, merge \([0-9.]*\) s, join[^0-9]*\([0-9.]*\) s.*/spawn \1 s, merge \2 s, join \3 s/p' "$d/err" | head -1)
      echo "trial $t: $spawn"
      if [ "$mode" = replace-again ]; then
        grep -q "^loom: replacement after recovery [0-9]* at step [0-9]*: replaced rank [0-9]* (a replacement, pid $newcomer on [^)]*) by rank [0-9]* (pid [0-9]* on " "$d/err" ||
          { cat "$d/err"; fail "trial $t: no second replacement report naming the lost replacement (pid $newcomer)"; }
        [ "$(grep -c "^loom: replacement: first good step ([0-9]*) on $np ranks done" "$d/err")" -ge 2 ] ||
          { cat "$d/err"; fail "trial $t: no first good step on $np ranks after the second replacement"; }
        echo "trial $t: samples/s $(sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p' "$d/out") (the clean run: $(sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p' "$work/clean.out"))"
      fi ;;
    refused)
      grep -q "^loom: replacement after recovery [0-9]*: no replacement for rank [0-9]* .*MPI_Comm_spawn_multiple.* failed: .*; $expect ranks go on" "$d/err" ||
        { cat "$d/err"; fail "trial $t: the survivors did not say why no replacement was started"; } ;;
    foreign)
      grep -q "it does not run the survivors' job: \[seed=7\] where rank 0 has \[seed=" "$d/err" ||
        { cat "$d/err"; fail "trial $t: the foreign replacement did not name the field that differs"; }
      grep -q "^loom: replacement after recovery [0-9]*: no replacement for rank [0-9]* .*runs another job.*; $expect ranks go on" "$d/err" ||
        { cat "$d/err"; fail "trial $t: the survivors did not say why they refused the replacement"; } ;;
  esac
  grep -q "ranks=$expect " "$d/out" || { cat "$d/out" "$d/err"; fail "trial $t: the result line does not say ranks=$expect"; }
  grep "^loom: recovery [0-9]" "$d/err" | sed 's/\. Roll call:.*//'
  grep -q "^loom: recovery [0-9]* at step [0-9]*: lost rank" "$d/err" || { cat "$d/err"; fail "trial $t: no recovery report naming the lost rank"; }
  if [ "$expect" -eq $((np - 2)) ]; then
    lost=$(sed -n -e 's/^loom: recovery [0-9]* at step [0-9]*: lost \(.*\); [0-9]* ranks go on.*/\1/p' \
                  -e 's/^loom: recovery [0-9]* at step [0-9]*: lost \(.*\); interrupted during its state exchange.*/\1/p' "$d/err" |
           grep -o "(world rank" | wc -l)
    [ "$lost" -ge 2 ] || { cat "$d/err"; fail "trial $t: two ranks died but the reports name $lost"; }
  fi
  if [ "$mode" = stop ]; then
    grep -q "did not answer within .*: the rank the others wait for" "$d/err" ||
      { cat "$d/err"; fail "trial $t: the roll call does not name the stopped rank"; }
    kill -9 "${pids[$i]}" 2>/dev/null && echo "trial $t: (the stopped process was still there; the survivors fence it on one host)"
  fi
  newest=$(ls "$d/ck" | grep -E '^step-[0-9]+$' | sed 's/step-//' | sort -n | tail -1)
  [ "$newest" = "$total" ] || fail "trial $t: the final checkpoint is step-$newest, expected step-$total: steps were lost"
  if [ "$mode" = bitwise ] || [[ " ${flags[*]} " == *" --deterministic-chunk "* ]]; then
    cmp "$work/clean.safetensors" "$d/weights.safetensors" ||
      fail "trial $t: the weights after the failure differ from the run without one"
    echo "trial $t: the weights are byte for byte the clean run's"
  fi
  acc=$(accuracy "$d/out")
  awk -v a="$acc" -v c="$clean" 'BEGIN { d = (a - c) * 100; if (d < 0) d = -d; exit !(d <= 0.5) }' ||
    fail "trial $t: test accuracy $acc is more than 0.5 points from the clean run's $clean"
  good=$(sed -n 's/.*first good step.*(unix time \([0-9.]*\)).*/\1/p' "$d/err" | head -1)
  took=$(awk -v g="$good" -v a="$at" 'BEGIN { printf "%.3f", g - a }')
  times+=("$took")
  echo "trial $t: status 0, ranks=$expect, test accuracy $acc (clean $clean), final step $newest, first good step $took s after the signal"
done
[ "${#times[@]}" -gt 0 ] || fail "no trial of $trials recovered in the process ($windowed ended by the rebuild watchdog)"
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
median=$(echo "$sorted" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
max=$(echo "$sorted" | tail -1)
echo "signal -> first good step over ${#times[@]} trials: median $median s, max $max s (all: $(echo $sorted))"
[ "$windowed" -eq 0 ] || echo "$windowed of $trials trials ended by the rebuild watchdog (status 75 on every survivor; see above)"
echo "PASS: $trials trials of $mode: every run finished${replacing:+ (every process: status files)} on $expect ranks, no step lost, accuracy within 0.5 points"
