#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The cost of deterministic (split-invariant) mode on 2, 3 and 4 ranks: builds
# bench_deterministic_cost if needed and runs it under mpirun once per rank count (1 thread per
# rank), after a line naming the machine. Flags after the rank counts go to the program:
#   deterministic_cost.sh [--ranks 2,3,4] [program flags: --chunk 16 --rounds 7 --steps-mlp 100 ...]
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (default 2), MPIRUN_FLAGS (extra
# mpirun flags). With more ranks than cores, mpirun gets --oversubscribe: the ranks then share
# cores, so the figures are those of a loaded machine (the header says how many cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-2}
source "$repo/benchmarks/common/lib.sh"
ranks=2,3,4
if [ "${1:-}" = --ranks ]; then ranks=$2; shift 2; fi
command -v mpirun >/dev/null || die "mpirun not found: apt-get install openmpi-bin libopenmpi-dev libboost-mpi-dev"
build bench_deterministic_cost
bench="$build_dir/benchmarks/data_parallel/bench_deterministic_cost"
[ -x "$bench" ] || die "$bench was not built (is loom::mpi configured?)"
mpi=(mpirun)
[ "$(id -u)" != 0 ] || mpi+=(--allow-run-as-root)
# shellcheck disable=SC2206
[ -z "${MPIRUN_FLAGS:-}" ] || mpi+=($MPIRUN_FLAGS)
echo "deterministic_cost.sh: $(nproc) cores: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1), $(date -u +%Y-%m-%dT%H:%MZ)"
for n in ${ranks//,/ }; do
  extra=()
  [ "$(nproc)" -ge "$n" ] || extra+=(--oversubscribe)
  echo "== $n ranks${extra:+ (oversubscribed: $n ranks on $(nproc) cores)}; load average before: $(cut -d" " -f1-3 /proc/loadavg)"
  "${strip_env[@]}" "${mpi[@]}" "${extra[@]}" -np "$n" "$bench" --threads 1 "$@"
done
