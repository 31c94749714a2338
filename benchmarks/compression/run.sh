#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What compressed gradients (loom::compress<bf16>, compress<fp16>) buy: the main example's mlp
# data-parallel on 2 ranks, on one host (shared memory) and across 2 hosts (network
# namespaces of this machine, TCP over veth, the link of host 1 limited with tc tbf), without
# and with compression, in interleaved rounds. Prints samples/s per round, the median ratio of
# each compression to none, the bytes each rank sent, and the CPU it ran on.
#   run.sh [--rounds 3] [--steps 400] [--rate 1gbit] [--batch 64]
# Needs root (ip netns, tc); without it the 2-host part is skipped. Environment: LOOM_BUILD_DIR
# (default build/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$repo/build}
rounds=3 steps=400 rate=1gbit batch=64
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "run.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
program=$build_dir/examples/fashion_mnist/fashion_mnist
[ -x "$program" ] || { echo "run.sh: build fashion_mnist first ($program)" >&2; exit 2; }
isa=$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || { grep -qw avx2 /proc/cpuinfo && echo AVX2 || echo "no AVX2"; })
f16c=$(grep -qw f16c /proc/cpuinfo && echo "F16C" || echo "no F16C")
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $(nproc) cores; $isa, $f16c"
flags=(--model mlp --batch "$batch" --max-steps "$steps" --threads 1 --quiet --test-samples 100)
sps() { sed -n 's/^result: .* samples_per_s=\([0-9.]*\) .*/\1/p' "$1"; }
sent() { sed -n 's/^ *0 .* \([0-9.]*\) *[0-9]*$/\1/p' "$1"; }

run_set() {  # run_set LABEL LAUNCH...: every compression, interleaved, $rounds rounds
  local label=$1 r c out
  shift
  for r in $(seq "$rounds"); do
    for c in none bf16 fp16; do
      out=$(mktemp)
      "$@" "$program" "${flags[@]}" --grad-compression "$c" > "$out" 2>&1 || { cat "$out"; echo "run.sh: $label $c failed"; exit 1; }
      echo "round: where=$label i=$r compression=$c samples_per_s=$(sps "$out")"
      rm -f "$out"
    done
  done
}

results=$(mktemp)
run_set one-host mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 | tee -a "$results"

if [ "$(id -u)" = 0 ] && ip netns list > /dev/null 2>&1; then
  CLUSTER_PREFIX=loombc
  source "$repo/tests/cluster/harness.sh"
  cluster_up 2
  cluster_hostfile "$CLUSTER_DIR/hosts" 1
  cluster_limit 1 "$rate" 4mbit
  echo "two hosts: 1 rank each, host 1's link limited to $rate (tc tbf)"
  run_set "two-hosts-$rate" cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" -np 2 | tee -a "$results"
  cluster_down
else
  echo "two hosts: skipped (needs root and ip netns)"
fi

echo
awk '
  /^round:/ {
    for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
    key = f["where"] SUBSEP f["i"]; v[key, f["compression"]] = f["samples_per_s"]; wheres[f["where"]] = 1; rounds[key] = f["where"]
  }
  function median(a, n,   i, j, t) { for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END {
    for (w in wheres) {
      for (c = 1; c <= 2; ++c) {
        name = c == 1 ? "bf16" : "fp16"; n = 0; delete r; delete base
        for (k in rounds) if (rounds[k] == w && v[k, "none"] > 0) { r[++n] = v[k, name] / v[k, "none"]; base[n] = v[k, "none"] }
        m = median(r, n)
        printf "compression: where=%s %s/none samples_per_s ratio median %.3f over %d rounds (none median %.0f samples/s)\n", w, name, m, n, median(base, n)
      }
    }
  }' "$results"
rm -f "$results"
