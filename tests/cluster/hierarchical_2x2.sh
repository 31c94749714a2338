#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# loom::hierarchical_comm across 2 hosts x 2 ranks (network namespaces, TCP): hosts of 2
# consecutive ranks, checked to be the ranks' namespaces; the slice and leader variants
# hierarchical over 2 hosts; data_parallel<hierarchical_comm> training the mlp to the
# parameters of data_parallel<mpi_comm> (test_parallel_hierarchical 2 --hosts-are-netns).
# Not MPI_COMM_TYPE_SHARED: every namespace has the machine's hostname, and Open MPI 4.1's
# MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) crashes there (a segfault in ob1's fragment
# matching: the ranks disagree on who is local), as does its shared-memory transport vader.
# usage: hierarchical_2x2.sh PROGRAM
set -u
here=$(cd "$(dirname "$0")" && pwd)
program=$1
CLUSTER_PREFIX=${CLUSTER_PREFIX:-loomhi}
source "$here/harness.sh"
fail() { echo "FAIL: $*"; exit 1; }
cluster_up 2
cluster_check_orted || fail "Open MPI's daemons do not connect back across the namespaces"
cluster_hostfile "$CLUSTER_DIR/hosts" 2
# The harness's transports (tcp,self): inside a host, TCP to the host's own address.
cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 4 -x OMP_NUM_THREADS=1 "$program" 2 --hosts-are-netns > "$CLUSTER_DIR/out" 2>&1 ||
  { cat "$CLUSTER_DIR/out"; fail "test_parallel_hierarchical across 2 hosts failed"; }
cat "$CLUSTER_DIR/out"
grep -q "^hosts are the network namespaces" "$CLUSTER_DIR/out" || fail "the hosts are not the namespaces"
grep -q "(slice, 2 hosts)" "$CLUSTER_DIR/out" || fail "the slice variant did not run over 2 hosts"
grep -q "(leader, 2 hosts)" "$CLUSTER_DIR/out" || fail "the leader variant did not run over 2 hosts"
grep -q "^all checks passed" "$CLUSTER_DIR/out" || fail "a check failed"
echo "PASS: hierarchical_comm over 2 hosts x 2 ranks (hosts = namespaces) trained as the flat mpi_comm does"
