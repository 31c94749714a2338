#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Data-parallel throughput with and without ZeRO stage 1 (--zero: loom::shard_optimizer_state)
# and compressed gradients (--grad-compression bf16): the main example's mlp and cnn on 2 and 4
# ranks, on one host (shared memory) and across 2 hosts (network namespaces of this machine,
# TCP over veth, host 1's link limited with tc tbf), every variant interleaved in each round.
# Prints samples/s per run, then per (where, model, ranks) the median samples/s of each
# variant, its median ratio to plain data parallelism, the share of exposed communication,
# rank 0's optimizer-state bytes (from the memory plan: mem_MB/plan_MB are printed too) and
# the CPU it ran on.
#   run.sh [--rounds 3] [--rate 1gbit] [--models mlp,cnn] [--ranks 2,4] [--optimizer adam]
#          [--baseline PROGRAM] [--variants LIST] [--program fashion_mnist|tensor_parallel|pipeline]
# --program: the example to run. tensor_parallel (2 replicas x tensor_parallel<2> on 4 ranks)
# and pipeline (--stages 2 --micro-batches 4: 2 replicas x 2 stages on 4 ranks) measure ZeRO
# over a hybrid's replicas; give them --models mlp --ranks 4 --variants plain,zero.
# --baseline: also runs --zero with PROGRAM (the example built from another commit, e.g. to
# measure a change of ZeRO itself), as variant zero-base, interleaved with the others.
# --variants: the variants to run (default: plain zero bf16, or with Adam plain zero plain-sgd
# bf16-sgd; zero-base with --baseline); plain (or plain-sgd) is each ratio's base.
# Needs root (ip netns, tc) for the 2-host part, which is skipped without it. Environment:
# LOOM_BUILD_DIR (default build/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$repo/build}
rounds=3 rate=1gbit models=mlp,cnn ranks=2,4 optimizer=adam baseline="" only="" example=fashion_mnist
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --variants) only=${2//,/ }; shift 2 ;;
    --program) example=$2; shift 2 ;;
    -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "run.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
case $example in
  fashion_mnist | tensor_parallel | pipeline) ;;
  *) echo "run.sh: --program takes fashion_mnist, tensor_parallel or pipeline, got $example" >&2; exit 2 ;;
esac
program=$build_dir/examples/$example/$example
[ -x "$program" ] || { echo "run.sh: build fashion_mnist first ($program)" >&2; exit 2; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "run.sh: --baseline $baseline is not an executable" >&2; exit 2; }
isa=$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || { grep -qw avx2 /proc/cpuinfo && echo AVX2 || echo "no AVX2"; })
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $(nproc) cores; $isa; $(mpirun --version | head -1)"
lr() { [ "$1" = adam ] && echo 0.001 || echo 0.05; }
# --grad-compression is built for SGD only in the example: with Adam, the bf16 variant runs SGD
# and is compared with plain SGD.
variants() {
  if [ -n "$only" ]; then echo "$only"; return; fi
  local v
  if [ "$optimizer" = adam ]; then v="plain zero plain-sgd bf16-sgd"; else v="plain zero bf16"; fi
  [ -z "$baseline" ] || v="$v zero-base"
  echo "$v"
}
flags_of() {  # flags_of VARIANT MODEL
  local steps=400
  [ "$2" = cnn ] && steps=60
  local f=(--model "$2" --batch 64 --max-steps $steps --threads 1 --test-samples 100)
  [ "$example" = pipeline ] && f+=(--stages 2 --micro-batches 4)
  case $1 in
    plain) f+=(--optimizer "$optimizer" --lr "$(lr "$optimizer")") ;;
    zero | zero-base) f+=(--optimizer "$optimizer" --lr "$(lr "$optimizer")" --zero) ;;
    plain-sgd) f+=(--optimizer sgd --lr 0.05) ;;
    bf16 | bf16-sgd) f+=(--optimizer sgd --lr 0.05 --grad-compression bf16) ;;
  esac
  echo "${f[@]}"
}

run_set() {  # run_set WHERE LAUNCH...: every model, rank count and variant, interleaved, $rounds rounds
  local where=$1 r m n v out
  shift
  for r in $(seq "$rounds"); do
    for m in ${models//,/ }; do
      for n in ${ranks//,/ }; do
        for v in $(variants); do
          out=$(mktemp)
          # shellcheck disable=SC2046
          local prog=$program
          [ "$v" = zero-base ] && prog=$baseline
          "$@" -np "$n" "$prog" $(flags_of "$v" "$m") > "$out" 2>&1 || { cat "$out"; echo "run.sh: $where $m $n $v failed"; exit 1; }
          local sps exposed fit mem plan
          sps=$(sed -n 's/^result: .* samples_per_s=\([0-9.]*\) .*/\1/p' "$out")
          exposed=$(sed -n 's/^result: .* comm_exposed_s=\([0-9.]*\).*/\1/p' "$out")
          if [ "$example" = pipeline ]; then
            # rank 0's row of the stage table: stage replica compute_s bubble_s bubble% exposed_s act_peak_MB params_MB mem_MB plan_MB sent_MB
            read -r _ _ _ c w _ e _ _ mem plan _ < <(grep -E '^ +0 ' "$out" | head -1)
            d=0
          else
            # rank 0's row of the per-rank table: compute_s comm_s exposed_s wait_s data_s mem_MB plan_MB sent_MB samples/s
            read -r _ c _ e w d mem plan _ _ < <(grep -E '^ +0 ' "$out" | head -1)
          fi
          fit=$(awk -v c="$c" -v e="$e" -v w="$w" -v d="$d" 'BEGIN { printf "%.3f", c + e + w + d }')
          echo "run: where=$where i=$r model=$m ranks=$n variant=$v samples_per_s=$sps exposed_s=$exposed step_s=$fit mem_MB=$mem plan_MB=$plan"
          rm -f "$out"
        done
      done
    done
  done
}

results=$(mktemp)
run_set one-host mpirun --allow-run-as-root --oversubscribe --bind-to none | tee -a "$results"

if [ "$(id -u)" = 0 ] && ip netns list > /dev/null 2>&1; then
  CLUSTER_PREFIX=loomzb
  source "$repo/tests/cluster/harness.sh"
  cluster_up 2
  cluster_hostfile "$CLUSTER_DIR/hosts" 2
  cluster_limit 1 "$rate" 4mbit
  echo "two hosts: ranks split over both, host 1's link limited to $rate (tc tbf)"
  run_set "two-hosts-$rate" cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" --map-by node | tee -a "$results"
  cluster_down
else
  echo "two hosts: skipped (needs root and ip netns)"
fi

echo
printf "%-18s %-4s %5s %-9s %11s %8s %9s %8s %8s %10s\n" where model ranks variant samples/s /plain exposed% mem_MB plan_MB /zero-base
awk '
  /^run:/ {
    for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
    g = f["where"] SUBSEP f["model"] SUBSEP f["ranks"]; groups[g] = 1; vs[f["variant"]] = 1
    k = g SUBSEP f["variant"] SUBSEP f["i"]; sps[k] = f["samples_per_s"]; ex[k] = f["exposed_s"] / (f["step_s"] > 0 ? f["step_s"] : 1)
    mem[g, f["variant"]] = f["mem_MB"]; plan[g, f["variant"]] = f["plan_MB"]; n[g] = f["i"] > n[g] ? f["i"] : n[g]
  }
  function median(a, m,   i, j, t) { for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END {
    for (g in groups) {
      split(g, p, SUBSEP)
      for (v in vs) {
        base = (v == "bf16-sgd" || v == "plain-sgd") ? "plain-sgd" : "plain"
        m = 0; mb = 0; delete s; delete r; delete e; delete rb
        for (i = 1; i <= n[g]; ++i) {
          k = g SUBSEP v SUBSEP i; b = g SUBSEP base SUBSEP i; zb = g SUBSEP "zero-base" SUBSEP i
          if (!(k in sps)) continue
          s[++m] = sps[k]; e[m] = ex[k]; r[m] = sps[b] > 0 ? sps[k] / sps[b] : 0
          if (v == "zero" && sps[zb] > 0) rb[++mb] = sps[k] / sps[zb]
        }
        vb = mb ? sprintf("%10.3f", median(rb, mb)) : ""
        if (m) printf "%-18s %-4s %5s %-9s %11.0f %8.3f %8.1f%% %8s %8s %s\n", p[1], p[2], p[3], v, median(s, m), median(r, m), 100 * median(e, m), mem[g, v], plan[g, v], vb
      }
    }
  }' "$results" | sort
rm -f "$results"
