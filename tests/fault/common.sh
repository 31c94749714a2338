# SPDX-License-Identifier: Apache-2.0
# What the scripts of tests/fault share (sourced after they set mpiexec): fail, now, and mpi,
# mpirun's command for ranks on this one machine (root, more ranks than cores, no binding, one
# thread per rank).
fail() { echo "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
mpi=("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
