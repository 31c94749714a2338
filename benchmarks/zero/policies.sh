#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ZeRO over hierarchical_comm, trained end to end: bench_data_parallel's samples/s of the
# example's mlp and cnn (SGD with momentum, 1 thread per rank) under data_parallel<mpi_comm>
# (dp), with shard_optimizer_state (zero), over hierarchical_comm (hier) and both (hier-zero),
# and the two ZeRO ones with the parameters' allgather waited for in the step instead of
# overlapped with the next forward (zero-blocking, hier-zero-blocking: LOOM_ZERO_GATHER=blocking),
# on 2 hosts x 2 ranks of the multi-host harness (tests/cluster/harness.sh: network
# namespaces, TCP over veth, every host's link limited with tc tbf; hosts of 2 consecutive
# ranks, LOOM_HIER_HOST_SIZE=2), and with --where one-host on this machine alone (shared
# memory, 4 ranks unless --ranks). Each (round, model, policy) is a fresh mpirun; the
# policies' order is reversed every other round. Prints every run, then per (model, policy) the median
# samples/s, the median over rounds of the ratio to dp of the same round, and the share of the
# step exposed to communication (rank 0's exposed_s over its fit time). Prints the CPU, Open MPI
# and the link in the header.
#   policies.sh [--rounds 3] [--rate 200mbit] [--models mlp,cnn] [--batch 64] [--where two-hosts]
#               [--policies dp,zero,hier,hier-zero] [--seconds 3] [--repeats 3] [--ranks 4]
# The runs' lines are kept in build/zero_policies.txt. The two-host part needs root (ip netns,
# tc): exits 77 without it. Environment: LOOM_BUILD_DIR (default build/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$repo/build}
rounds=3 rate=200mbit models=mlp,cnn batch=64 policies=dp,zero,hier,hier-zero seconds=3 repeats=3 where=two-hosts ranks=4
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --where) where=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "policies.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
bench=$build_dir/benchmarks/data_parallel/bench_data_parallel
[ -x "$bench" ] || { echo "policies.sh: build bench_data_parallel first ($bench)" >&2; exit 2; }
case $where in
  one-host) ;;
  two-hosts) [ "$(id -u)" = 0 ] || { echo "policies.sh: needs root for ip netns and tc" >&2; exit 77; } ;;
  *) echo "policies.sh: --where takes one-host or two-hosts, got $where" >&2; exit 2 ;;
esac
case ",$policies," in *,dp,*) ;; *) echo "policies.sh: --policies must include dp (each ratio's base)" >&2; exit 2 ;; esac

jobs=$(nproc)
source "$repo/benchmarks/common/lib.sh"
echo "cpu: $(cpu_line); $(nproc) cores; $(mpirun --version | head -1)"
if [ "$where" = two-hosts ]; then
  echo "2 hosts x 2 ranks (network namespaces, TCP over veth), every host's link limited to $rate (tc tbf);" \
       "global batch $batch, SGD with momentum, 1 thread per rank; $rounds rounds"
  CLUSTER_PREFIX=${CLUSTER_PREFIX:-loomzp}
  source "$repo/tests/cluster/harness.sh"
  cluster_up 2
  cluster_hostfile "$CLUSTER_DIR/hosts" 2
  cluster_limit 0 "$rate" 4mbit
  cluster_limit 1 "$rate" 4mbit
  work=$CLUSTER_DIR
  launch() { cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 4 -x LOOM_HIER_HOST_SIZE=2 "$@"; }
else
  echo "one host, $ranks ranks (shared memory; hierarchical: hosts of 2 consecutive ranks);" \
       "global batch $batch, SGD with momentum, 1 thread per rank; $rounds rounds"
  work=$(mktemp -d /tmp/loomzp.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  launch() { mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" -x LOOM_HIER_HOST_SIZE=2 "$@"; }
fi
results=$work/runs.txt
: > "$results"
order=${policies//,/ }
reversed=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq "$rounds"); do
  list=$order
  [ $((r % 2)) = 0 ] && list=$reversed
  for m in ${models//,/ }; do
    for p in $list; do
      out=$work/run.out
      gather=overlapped
      case $p in *-blocking) gather=blocking ;; esac
      launch -x OMP_NUM_THREADS=1 -x LOOM_ZERO_GATHER=$gather "$bench" --model "$m" --batch "$batch" \
        --policy "${p%-blocking}" --seconds "$seconds" --repeats "$repeats" --warmup 1 > "$out" 2> "$out.err" ||
        { cat "$out" "$out.err"; echo "policies.sh: $m $p failed"; exit 1; }
      # (stdout alone: mpirun may interleave the ranks' stderr into a line of it)
      row=$(grep -m1 '^row: ' "$out") || { cat "$out" "$out.err"; echo "policies.sh: $m $p printed no row: line"; exit 1; }
      echo "run: i=$r model=$m policy=$p samples_per_s=$(field "$row" samples_per_s) exposed_s=$(field "$row" exposed_s)" \
           "fit_s=$(field "$row" fit_s)" |
        tee -a "$results"
    done
  done
done
cp "$results" "$build_dir/zero_policies.txt"
if [ "$where" = two-hosts ]; then cluster_down; fi

echo
printf "%-5s %-18s %11s %8s %9s\n" model policy samples/s /dp exposed%
awk '
  /^run:/ {
    for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
    k = f["model"] SUBSEP f["policy"]; keys[k] = 1; n[k]++
    sps[k, f["i"]] = f["samples_per_s"]; ex[k, f["i"]] = f["fit_s"] > 0 ? f["exposed_s"] / f["fit_s"] : 0
    rounds = f["i"] > rounds ? f["i"] : rounds
  }
  function median(a, m,   i, j, t) { for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END {
    for (k in keys) {
      split(k, p, SUBSEP); b = p[1] SUBSEP "dp"
      m = 0; delete s; delete r; delete e
      for (i = 1; i <= rounds; ++i) {
        if (!((k, i) in sps)) continue
        s[++m] = sps[k, i]; e[m] = ex[k, i]; r[m] = sps[b, i] > 0 ? sps[k, i] / sps[b, i] : 0
      }
      if (m) printf "%-5s %-18s %11.0f %8.3f %8.1f%%\n", p[1], p[2], median(s, m), median(r, m), 100 * median(e, m)
    }
  }' "$build_dir/zero_policies.txt" | sort
