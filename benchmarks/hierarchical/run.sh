#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# loom::hierarchical_comm's allreduce against a flat MPI_Allreduce on 2 hosts x 2 ranks: the
# multi-host harness (tests/cluster/harness.sh: network namespaces of this machine, TCP over
# veth between hosts, TCP to the host's own address inside a host), every host's link limited
# with tc tbf. Hosts are 2 consecutive ranks (LOOM_HIER_HOST_SIZE=2, what the hostfile's slots
# give): MPI_COMM_TYPE_SHARED crashes Open MPI 4.1 across namespaces that share one hostname. Per size from 64 KiB to 64 MiB: the median bus bandwidth of raw
# MPI_Allreduce, of hierarchical_comm's slice and leader variants and of slice's iallreduce,
# and each one's ratio to raw; then ZeRO's reduce-scatter and allgather of blocks (size/4 each),
# flat (mpi_comm's, blocking and not) against hierarchical_comm's slice (blocking and not), each
# one's ratio to the flat blocking one. Prints the CPU, Open MPI and the link in the header.
#   run.sh [--rate 1gbit] [--repeats 5] [--seconds 0.2] [--sizes 64K,256K,1M,4M,16M,64M] [--btl tcp,self]
#          [--variants all | raw,slice,leader,slice-i | rs-flat,rs-flat-i,rs-slice,rs-slice-i,ag-flat,...]
# Needs root (ip netns, tc). Environment: LOOM_BUILD_DIR (default build/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$repo/build}
rate=1gbit repeats=5 seconds=0.2 sizes=64K,256K,1M,4M,16M,64M btl=tcp,self variants=all
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --btl) btl=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "run.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
bench=$build_dir/benchmarks/hierarchical/bench_hierarchical
[ -x "$bench" ] || { echo "run.sh: build bench_hierarchical first ($bench)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run.sh: needs root for ip netns and tc" >&2; exit 77; }

CLUSTER_PREFIX=${CLUSTER_PREFIX:-loomhb}
source "$repo/tests/cluster/harness.sh"
cluster_up 2
cluster_hostfile "$CLUSTER_DIR/hosts" 2
cluster_limit 0 "$rate" 4mbit
cluster_limit 1 "$rate" 4mbit
for i in "${!CLUSTER_MCA[@]}"; do [ "${CLUSTER_MCA[$i]}" = "tcp,self" ] && CLUSTER_MCA[$i]=$btl; done
out=$CLUSTER_DIR/rows.txt
started=$SECONDS
cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 4 -x OMP_NUM_THREADS=1 -x LOOM_HIER_HOST_SIZE=2 "$bench" --sizes "$sizes" \
  --variants "$variants" --repeats "$repeats" --seconds "$seconds" | tee "$out" >&2

echo
echo "Allreduce, float sum in place, 2 hosts x 2 ranks (network namespaces, TCP over veth, each host's link"
echo "limited to $rate by tc tbf; btl $btl), median of $repeats batches, $((SECONDS - started)) s"
echo "  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $(nproc) cores; $(mpirun --version 2>/dev/null | head -n1)"
echo
awk '
  function get(line, key,   n, i, a) {
    n = split(line, a, " ")
    for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
    return ""
  }
  function size(b) { return (b + 0 >= 1048576) ? sprintf("%dM", b / 1048576) : sprintf("%dK", b / 1024) }
  /^row:/ {
    b = get($0, "bytes"); v = get($0, "impl")
    if (!(b in seen)) { seen[b] = 1; order[++rows] = b }
    bw[v, b] = get($0, "busbw_gbs"); us[v, b] = get($0, "latency_us"); mode[v] = get($0, "mode")
  }
  function cell(v, b) { return ((v, b) in bw) ? sprintf("%7.3f %5.2f", bw[v, b], bw[v, b] / bw["raw", b]) : sprintf("%7s %5s", "-", "-") }
  END {
    printf "%6s | %10s %7s | %13s | %13s | %13s\n", "", "raw MPI_Al", "lreduce", "slice", "leader", "slice-i"
    printf "%6s | %10s %7s | %7s %5s | %7s %5s | %7s %5s\n", "size", "us", "GB/s", "GB/s", "/raw", "GB/s", "/raw", "GB/s", "/raw"
    for (i = 1; i <= rows; i++) {
      b = order[i]
      printf "%6s | %10.0f %7.3f | %s | %s | %s\n", size(b), us["raw", b], bw["raw", b], cell("slice", b), cell("leader", b), cell("slice-i", b)
    }
    print ""
    print "GB/s: bus bandwidth = size / time * 2(n-1)/n, n = 4; /raw: this bandwidth / raw MPI_Allreduce'\''s (above 1: faster)."
    printf "modes: slice %s, leader %s\n", mode["slice"], mode["leader"]
    if (!(("rs-flat", order[1]) in bw) && !(("ag-flat", order[1]) in bw)) exit
    print ""
    print "ZeRO'\''s collectives: blocks of size/4 (reduce_scatter_v, allgather_v); GB/s = size / time * (n-1)/n; /flat: against the flat blocking one"
    printf "%6s | %7s | %7s %5s | %7s %5s | %7s %5s || %7s | %7s %5s | %7s %5s | %7s %5s\n", "", "rs-flat", "rs-fl-i", "", "rs-slic", "", "rs-sl-i", "", "ag-flat", "ag-fl-i", "", "ag-slic", "", "ag-sl-i", ""
    for (i = 1; i <= rows; i++) {
      b = order[i]
      printf "%6s | %7.3f | %s | %s | %s || %7.3f | %s | %s | %s\n", size(b), bw["rs-flat", b], rel("rs-flat-i", "rs-flat", b), rel("rs-slice", "rs-flat", b), rel("rs-slice-i", "rs-flat", b), bw["ag-flat", b], rel("ag-flat-i", "ag-flat", b), rel("ag-slice", "ag-flat", b), rel("ag-slice-i", "ag-flat", b)
    }
  }
  function rel(v, base, b) { return ((v, b) in bw && bw[base, b] > 0) ? sprintf("%7.3f %5.2f", bw[v, b], bw[v, b] / bw[base, b]) : sprintf("%7s %5s", "-", "-") }' "$out"
cluster_down
