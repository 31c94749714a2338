#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fashion-MNIST as tar shards, end to end (docs/data.md). One of:
#   convert   loom-shards --idx (a small part: --limit) into WORK/shards; GNU tar lists a shard
#             with as many members as the manifest says
#   train     the main example on 2 ranks (mpirun) reading the shards: a short run that learns
#   resume    tests/examples/checkpoint_resume.sh on the shards: a run killed (kill -9) after a
#             mid-epoch checkpoint resumes and ends with the uninterrupted run's weights, byte
#             for byte; and a mid-epoch checkpoint is refused by a run that deals the shards into
#             other streams (another order), with a sentence naming both
# Exits 77 (skipped) when Fashion-MNIST is not installed.
# usage: shard_example.sh MODE WORK IDX_DIR LOOM_SHARDS FASHION_MNIST MPIEXEC CHECKPOINT_SCRIPT
set -u
mode=$1 work=$2 idx=$3 convert=$4 program=$5 mpiexec=$6 resume=$7
fail() { echo "FAIL: $*"; exit 1; }
[ -e "$idx/train-images-idx3-ubyte.gz" ] || [ -e "$idx/train-images-idx3-ubyte" ] ||
  { echo "Fashion-MNIST is not in $idx (apt-get install dataset-fashion-mnist): skipped"; exit 77; }
shards=$work/shards
case $mode in
convert)
  rm -rf "$work" && mkdir -p "$work"
  "$convert" --idx "$idx" --out "$shards" --limit 1920 --samples-per-shard 240 || fail "loom-shards failed"
  [ "$(ls "$shards"/train-*.tar | wc -l)" = 8 ] || fail "expected 8 training shards"
  members=$(tar -tvf "$shards/train-000003.tar" | wc -l)
  [ "$members" = 480 ] || fail "tar -tvf lists $members members of train-000003.tar, expected 240 samples x 2"
  tar -tvf "$shards/train-000003.tar" | head -2
  grep -q '"samples": 1920' "$shards/train.shards.json" || fail "the manifest does not count 1920 samples"
  echo "PASS: converted"
  ;;
train)
  out=$("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$program" --data "$shards" --epochs 4 \
        --threads 1 --batch 32 --lr 0.05 --quiet 2> "$work/train.err") || { cat "$work/train.err"; fail "training failed"; }
  echo "$out"
  acc=$(echo "$out" | sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p')
  ranks=$(echo "$out" | sed -n 's/.* ranks=\([0-9]*\).*/\1/p')
  [ "$ranks" = 2 ] || fail "expected ranks=2"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.6) }' || fail "test accuracy $acc after 4 short epochs: expected at least 0.6"
  ! grep -q "skipped" "$work/train.err" || fail "samples were skipped: $(cat "$work/train.err")"
  echo "PASS: trained on the shards to test accuracy $acc"
  ;;
resume)
  bash "$resume" kill "$mpiexec" 2 2 "$program" "$work/resume" 50 10 20 -- --data "$shards" --threads 1 --batch 64 \
    --epochs 100 || exit 1
  rm -rf "$work/other" && mkdir -p "$work/other"
  mpi=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$program" --data "$shards" --threads 1
       --batch 64 --quiet --checkpoint-dir "$work/other/ck")
  "${mpi[@]}" --max-steps 12 > /dev/null 2>&1 || fail "the run to step 12 failed"
  [ -d "$work/other/ck/step-12" ] || fail "no checkpoint at step 12"
  "${mpi[@]}" --max-steps 20 --resume --shard-streams 8 > "$work/other/out" 2> "$work/other/err" &&
    fail "a mid-epoch resume with 8 streams instead of 16 was not refused"
  grep -q "cannot resume exactly from .*step-12: it stopped in the middle of an epoch of the data shards:.*streams=16.*this training set is shards:.*streams=8" \
    "$work/other/err" || { cat "$work/other/err"; fail "no sentence naming both data identities"; }
  grep -o "cannot resume exactly.*" "$work/other/err" | head -1
  echo "PASS: resumed bitwise; another dealing of the shards refused mid-epoch"
  ;;
*) fail "unknown mode $mode" ;;
esac
