#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fashion-MNIST as tar shards, end to end (docs/data.md). One of:
#   convert   loom-shards --idx (a small part: --limit) into WORK/shards; GNU tar lists a shard
#             with as many members as the manifest says; then --folder (class folders of some of
#             those PNGs, re-encoded as JPEG), --list and --scan, each checked against its source
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
  # A folder of class folders, from 100 of those samples.
  mkdir -p "$work/x" "$work/folder"
  tar -xf "$shards/train-000000.tar" -C "$work/x"
  for png in $(ls "$work/x"/*.png | head -100); do
    cls=$(cat "${png%.png}.cls")
    mkdir -p "$work/folder/class-$cls"
    cp "$png" "$work/folder/class-$cls/"
    echo "$png $cls" >> "$work/list.txt"
  done
  classes=$(ls "$work/folder" | wc -l)
  "$convert" --folder "$work/folder" --out "$work/from-folder" --format jpeg --quality 90 --samples-per-shard 30 ||
    fail "loom-shards --folder failed"
  grep -q '"samples": 100' "$work/from-folder/train.shards.json" || fail "--folder: the manifest does not count 100"
  [ "$(wc -l < "$work/from-folder/classes.txt")" = "$classes" ] || fail "--folder: classes.txt does not list $classes classes"
  [ "$(tar -tf "$work/from-folder/train-000000.tar" | grep -c '\.jpg$')" = 30 ] || fail "--folder: expected 30 JPEGs in a shard"
  "$convert" --list "$work/list.txt" --out "$work/from-list" --split val || fail "loom-shards --list failed"
  grep -q '"samples": 100' "$work/from-list/val.shards.json" || fail "--list: the manifest does not count 100"
  # The list's labels, sample by sample (as PNG bytes): the same multiset of (image, label).
  ( cd "$work/x" && for png in $(ls *.png | head -100); do echo "$(md5sum < "$png" | cut -c1-32) $(cat "${png%.png}.cls")"; done | sort ) > "$work/want"
  mkdir -p "$work/y" && for t in "$work/from-list"/val-*.tar; do tar -xf "$t" -C "$work/y"; done
  ( cd "$work/y" && for png in *.png; do echo "$(md5sum < "$png" | cut -c1-32) $(cat "${png%.png}.cls")"; done | sort ) > "$work/got"
  cmp -s "$work/want" "$work/got" || fail "--list: the shards' (image, label) pairs are not the list's"
  # --scan: the manifest of shards that have none.
  mkdir -p "$work/scan" && cp "$work/from-folder"/train-*.tar "$work/scan/"
  "$convert" --scan "$work/scan" || fail "loom-shards --scan failed"
  grep -q '"samples": 100' "$work/scan/train.shards.json" || fail "--scan: the manifest does not count 100"
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
