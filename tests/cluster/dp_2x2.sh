#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Data parallel across 2 hosts x 2 ranks (network namespaces, TCP): the main example finishes
# with ranks=4 and the params_l2 of the same run on one host (4 ranks, plain mpirun), within 1e-5
# relative (the tolerance of tests/examples/compare_params.cmake); prints both wall times.
# usage: dp_2x2.sh PROGRAM -- flags...
set -u
here=$(cd "$(dirname "$0")" && pwd)
program=$1
shift
[ "$1" = "--" ] && shift
flags=("$@")
source "$here/harness.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_up 2
cluster_check_orted || fail "Open MPI's daemons do not connect back across the namespaces"
cluster_hostfile "$CLUSTER_DIR/hosts" 2
l2() { sed -n 's/^result: .* params_l2=\([0-9.]*\) .*/\1/p' "$1"; }

echo "== one host: 4 ranks, plain mpirun"
t0=$(date +%s.%N)
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 "$program" "${flags[@]}" --save-weights "$CLUSTER_DIR/one.safetensors" > "$CLUSTER_DIR/one.out" 2> "$CLUSTER_DIR/one.err" ||
  { cat "$CLUSTER_DIR/one.err"; fail "the one-host run failed"; }
t1=$(date +%s.%N)
grep "^result:" "$CLUSTER_DIR/one.out"
echo "== 2 hosts x 2 ranks across the namespaces"
cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 4 "$program" "${flags[@]}" --save-weights "$CLUSTER_DIR/two.safetensors" > "$CLUSTER_DIR/two.out" 2> "$CLUSTER_DIR/two.err" ||
  { cat "$CLUSTER_DIR/two.err"; fail "the run across 2 hosts failed"; }
t2=$(date +%s.%N)
grep "^result:" "$CLUSTER_DIR/two.out"
grep -q "^result: .* ranks=4 " "$CLUSTER_DIR/two.out" || fail "the run across the hosts has no result line with ranks=4"
a=$(l2 "$CLUSTER_DIR/one.out") b=$(l2 "$CLUSTER_DIR/two.out")
[ -n "$a" ] && [ -n "$b" ] || fail "no params_l2 in a result line (one host: '$a', two hosts: '$b')"
echo "wall time: one host $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s, 2 hosts x 2 ranks $(awk "BEGIN { printf \"%.2f\", $t2 - $t1 }") s"
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' ||
  fail "params_l2 differs by more than 1e-5 relative: across the hosts $b, on one host $a"
[ "$a" = "$b" ] && same="equal to the 6 decimals printed" || same="within 1e-5 relative"
cmp -s "$CLUSTER_DIR/one.safetensors" "$CLUSTER_DIR/two.safetensors" && same="$same (the weights files are bitwise equal)" ||
  same="$same (the weights files differ in bits)"
echo "PASS: params_l2 across 2 hosts ($b) and on one host ($a): $same"
