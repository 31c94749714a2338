#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Shards on shared storage across 2 hosts x 2 ranks (network namespaces sharing one file
# system, as hosts share NFS or Lustre):
#   1. the shard loader's checks on real ranks (tests/data/shard_loader_mpi.cpp): every sample
#      once per epoch over the 4 ranks, each rank's share the part of the one-rank batch at its
#      offset, and each rank's bytes read (/proc/self/io) those of its own streams' shards only;
#   2. the main example trains across the hosts from one shards directory (loom-shards makes it).
# usage: shards_2x2.sh SHARD_CHECKS LOOM_SHARDS FASHION_MNIST IDX_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
checks=$1 convert=$2 program=$3 idx=$4
source "$here/harness.sh"
fail() { echo "FAIL: $*"; exit 1; }
[ -e "$idx/train-images-idx3-ubyte.gz" ] || [ -e "$idx/train-images-idx3-ubyte" ] ||
  { echo "Fashion-MNIST is not in $idx (apt-get install dataset-fashion-mnist): skipped"; exit 77; }
cluster_up 2
cluster_check_orted || fail "Open MPI's daemons do not connect back across the namespaces"
cluster_hostfile "$CLUSTER_DIR/hosts" 2

echo "== the shard loader's checks, 2 hosts x 2 ranks"
cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 4 "$checks" > "$CLUSTER_DIR/checks.out" 2> "$CLUSTER_DIR/checks.err" ||
  { cat "$CLUSTER_DIR/checks.out" "$CLUSTER_DIR/checks.err"; fail "the shard loader's checks failed across the hosts"; }
grep -q "all checks passed" "$CLUSTER_DIR/checks.out" || { cat "$CLUSTER_DIR/checks.out"; fail "no 'all checks passed'"; }
grep -i "bytes" "$CLUSTER_DIR/checks.out" | head -4

echo "== the main example from one shards directory, 2 hosts x 2 ranks"
"$convert" --idx "$idx" --out "$CLUSTER_DIR/shards" --limit 3840 --samples-per-shard 240 > /dev/null || fail "loom-shards failed"
cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 4 "$program" --data "$CLUSTER_DIR/shards" --epochs 2 --threads 1 \
  --batch 64 --quiet > "$CLUSTER_DIR/train.out" 2> "$CLUSTER_DIR/train.err" ||
  { cat "$CLUSTER_DIR/train.err"; fail "training across the hosts from the shards failed"; }
grep "^result:" "$CLUSTER_DIR/train.out"
grep -q "^result: .* ranks=4 " "$CLUSTER_DIR/train.out" || fail "no result line with ranks=4"
echo "PASS: 2 hosts read one shards directory, each rank only its own shards, and trained from it"
