#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# loom's mpi_comm allreduce against raw MPI_Allreduce (float, sum, in place) on 2 ranks. Modes:
#   run.sh [all]          memory, table, algorithms and malloc below, one after the other (~4.5 min)
#   run.sh table [--repeats 7] [--seconds 0.1] [--chunk 16M] [--sizes LIST]
#                         the main table: per size, raw MPI_Allreduce, loom::mpi_comm::allreduce,
#                         its iallreduce (what data_parallel uses), and the chunked prototype
#                         (pieces of --chunk bytes back to back; chunked-i: all in flight), in
#                         one mpirun, interleaved batch by batch (chunked-i in a second), medians.
#   run.sh memory         memcpy, the reduction kernel (dst += src) and memcpy into freshly
#                         malloc'd memory, in one process and in two processes at once.
#   run.sh algorithms     raw MPI_Allreduce with each of Open MPI's tuned allreduce algorithms
#                         forced (coll_tuned_allreduce_algorithm 0..6; 0 = Open MPI's own
#                         choice), and loom's iallreduce with each of libnbc's (0..4).
#   run.sh malloc         raw, loom-i and chunked at 16-64 MiB with glibc's malloc as is and with
#                         mmap off (GLIBC_TUNABLES), to show what the per-call scratch buffer costs.
#   run.sh cluster [--rate R] [--repeats 5] [--seconds 0.1] [--sizes LIST]
#                         the main table over TCP: 2 hosts x 1 rank of the multi-host harness
#                         (tests/cluster/harness.sh: network namespaces, veth, btl tcp,self,
#                         --bind-to none), each host's link limited to R with tc tbf when given
#                         (e.g. 1gbit; default: not limited). Needs root; exits 77 without it.
#   run.sh reduce-scatter [--cluster] [--rate R] [--repeats 5] [--sizes LIST]
#                         ZeRO's gradient exchange: Open MPI's MPI_Reduce_scatter (blocking) and
#                         MPI_Ireduce_scatter against loom's ireduce_scatter_v (a direct exchange),
#                         each as time over a raw MPI_Allreduce of the same buffer in the same run
#                         (a reduce-scatter moves half of it: 0.5 is the goal); --cluster: 2 hosts
#                         x 1 rank of the multi-host harness over TCP, as cluster.
#   run.sh split-gradient [flags of bench_split_gradient, e.g. --rounds 5 --pieces 1,2,4,8,16]
#                         whether splitting pays for the mlp: its first layer's weight-gradient
#                         product computed whole then one blocking allreduce of every gradient
#                         (what data_parallel does), against the product in k blocks of rows, each
#                         block's MPI_Iallreduce started as it is done; per k the step time, the
#                         time after the last block (exposed), and the step time over the whole's
#                         (benchmarks/allreduce/split_gradient.cpp; RANKS ranks, 1 thread each).
#   run.sh print FILE...  the tables again from the raw lines of earlier runs.
# Environment: LOOM_BUILD_DIR (default build/; if configuring or building there fails,
# build-bench/ with LOOM_BUILD_TESTS=OFF), LOOM_JOBS (default 2), RANKS (default 2), RESULTS
# (prefix of the raw-line files, default BUILD_DIR/allreduce), ROUNDS (rounds of the algorithms
# and malloc sweeps: each configuration runs once per round, default 1), MPIRUN_FLAGS (extra
# mpirun flags), QUIET_WAIT (seconds to wait for an idle machine before each mpirun, default 0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-2}
ranks=${RANKS:-2}
rounds=${ROUNDS:-1}

# strip_env, die, quiet_wait, build, mpi_flags, field
source "$repo/benchmarks/common/lib.sh"

setup() {
  command -v mpirun >/dev/null || die "mpirun not found: apt-get install openmpi-bin libopenmpi-dev libboost-mpi-dev"
  build bench_allreduce
  bench="$build_dir/benchmarks/allreduce/bench_allreduce"
  [ -x "$bench" ] || die "$bench was not built (is loom::mpi configured? it needs Open MPI and Boost.MPI)"
  results=${RESULTS:-$build_dir/allreduce}
  mpi=(mpirun)
  [ "$(id -u)" != 0 ] || mpi+=(--allow-run-as-root)
  [ "$(nproc)" -ge "$ranks" ] || mpi+=(--oversubscribe)
  # shellcheck disable=SC2206
  [ -z "${MPIRUN_FLAGS:-}" ] || mpi+=($MPIRUN_FLAGS)
}

header() {
  echo "$1 ($(nproc) cores: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1);" \
    "$(mpirun --version 2>/dev/null | head -n1); $(date -u +%Y-%m-%dT%H:%MZ))"
  echo "  CPU: $(cpu_line)"
  local mca
  mca=$(env | grep '^OMPI_MCA_' | tr '\n' ' ' || true)
  [ -z "$mca" ] || echo "  Open MPI settings from the environment: $mca"
}

# ---------------------------------------------------------------------------------------------
# The main table from `row:` lines (file $1).
table_print() {
  awk '
    function get(line, key,   n, i, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function add(list, k, v) { if (k in list) list[k] = list[k] "," v; else list[k] = v }  # comma-separated
    function size(b) { return (b + 0 >= 1048576) ? sprintf("%dM", b / 1048576) : sprintf("%dK", b / 1024) }
    function med(list,   n, a, i, j, t) {
      n = split(list, a, ",")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function r(v, b) { return (((v, b) in lat) && (("raw", b) in lat)) ? sprintf("%.2f", lat["raw", b] / lat[v, b]) : "-" }
    function bw(v, b) { return ((v, b) in lat) ? sprintf("%.2f", b / lat[v, b] / 1000 * factor) : "-" }
    function us(v, b) { return ((v, b) in lat) ? ((lat[v, b] >= 1000) ? sprintf("%.0f", lat[v, b]) : sprintf("%.1f", lat[v, b])) : "-" }
    function fl(v, b) { return ((v, b) in flt) ? sprintf("%.0f", med(flt[v, b])) : "-" }
    /^row:/ {
      b = get($0, "bytes") + 0; v = get($0, "impl"); sub(/:.*/, "", v); n = get($0, "ranks")
      factor = n > 1 ? 2 * (n - 1) / n : 1
      if (!(b in seen)) { seen[b] = 1; order[++rows] = b }
      add(runs, v SUBSEP b, get($0, "runs_us"))
      add(flt, v SUBSEP b, get($0, "faults_per_call"))
      o = get($0, "others_cores"); if (!(b in oth) || o + 0 > oth[b] + 0) oth[b] = o
      if (v == "chunked") chunk = get($0, "chunk")
    }
    END {
      for (k in runs) { split(k, kk, SUBSEP); lat[kk[1], kk[2]] = med(runs[k]) }
      printf "%6s %9s %6s | %9s %6s %5s | %6s %5s | %9s %6s %5s | %6s %5s | %6s %5s | %6s %5s | %7s %7s %7s | %s\n", "", "raw", "", \
        "loom", "", "", "loom-i", "", "chunked", "", "", "chunk-i", "", "bf16", "", "fp16", "", "faults", "per", "call", "others"
      printf "%6s %9s %6s | %9s %6s %5s | %6s %5s | %9s %6s %5s | %6s %5s | %6s %5s | %6s %5s | %7s %7s %7s | %s\n", "size", "us", "GB/s", \
        "us", "GB/s", "/raw", "GB/s", "/raw", "us", "GB/s", "/raw", "GB/s", "/raw", "GB/s", "/raw", "GB/s", "/raw", "raw", "loom-i", "chunked", "cores"
      for (i = 1; i <= rows; i++) {
        b = order[i]
        printf "%6s %9s %6s | %9s %6s %5s | %6s %5s | %9s %6s %5s | %6s %5s | %6s %5s | %6s %5s | %7s %7s %7s | %s\n", size(b), \
          us("raw", b), bw("raw", b), us("loom", b), bw("loom", b), r("loom", b), bw("loom-i", b), r("loom-i", b), \
          us("chunked", b), bw("chunked", b), r("chunked", b), bw("chunked-i", b), r("chunked-i", b), \
          bw("bf16", b), r("bf16", b), bw("fp16", b), r("fp16", b), \
          fl("raw", b), fl("loom-i", b), fl("chunked", b), oth[b] ((oth[b] + 0 > 0.25) ? "*" : "")
        # Targets: loom and chunked from 1 MiB, loom-i (the overlapped path data_parallel takes)
        # from 64 KiB.
        for (k = 1; k <= 3; k++) {
          v = (k == 1) ? "loom" : (k == 2) ? "chunked" : "loom-i"
          if (b < ((k == 3) ? 65536 : 1048576)) continue
          if (((v, b) in lat) && (("raw", b) in lat)) {
            q = lat["raw", b] / lat[v, b]
            if (!(v in worst) || q < worst[v]) { worst[v] = q; wsize[v] = size(b) }
          }
        }
        if (oth[b] + 0 > 0.25) marked = 1
      }
      print ""
      print "us: median time per call; GB/s: bus bandwidth = size / time * 2(n-1)/n; /raw: raw time / this time"
      print "(above 1: faster than raw MPI_Allreduce); faults: minor page faults per call (fresh memory touched)."
      printf "chunked = allreduce in pieces of %s bytes back to back (mpi_comm::with_max_count); chunk-i = the same\n", chunk
      print "pieces as iallreduce, all in flight, then wait; loom-i = one iallreduce + wait (what data_parallel does);"
      print "bf16, fp16 = to 16 bits, allreduce of the copy (summed in float), back (the last bucket of loom::compress<H>),"
      print "GB/s on the float size."
      if (marked) print "* other processes kept more than 0.25 cores busy during that size (the most of any batch): noisy."
      print ""
      for (k = 1; k <= 3; k++) {
        v = (k == 1) ? "loom" : (k == 2) ? "chunked" : "loom-i"
        if (v in worst)
          printf "target (%s/raw >= 0.95 at every size from %s): %s (lowest %.2f at %s)\n", v, (k == 3) ? "64K" : "1M", \
            (worst[v] >= 0.95 ? "meets" : "misses"), worst[v], wsize[v]
      }
    }' "$@"
}

table() {
  local repeats=7 seconds=0.1 chunk=16M sizes=4K,16K,64K,256K,1M,2M,4M,8M,16M,32M,64M
  while [ $# -gt 0 ]; do
    case $1 in
      --repeats) repeats=$2; shift 2 ;;
      --seconds) seconds=$2; shift 2 ;;
      --chunk) chunk=$2; shift 2 ;;
      --sizes) sizes=$2; shift 2 ;;
      *) die "unknown flag $1 (see the top of $0)" ;;
    esac
  done
  local out="$results.txt" started=$SECONDS v size
  : >"$out"
  : >"$out.stderr"
  # One mpirun per size (short runs, each after quiet_wait when QUIET_WAIT is set). In it, raw,
  # loom, loom-i and chunked interleaved batch by batch (noise hits all alike); chunked-i in a
  # second one: its pieces' scratch buffers, all allocated at once, grow the heap, and the free
  # blocks they leave would serve raw's 32-64 MiB scratch allocations without page faults,
  # which a program of only raw calls does not get.
  for size in ${sizes//,/ }; do
    for v in raw,loom,loom-i,chunked,bf16,fp16 chunked-i; do
      echo "run.sh: table: ${mpi[*]} -np $ranks $bench --variants $v --sizes $size --chunk $chunk --repeats $repeats" \
        "--seconds $seconds" >&2
      quiet_wait
      "${mpi[@]}" -np "$ranks" "$bench" --variants "$v" --chunk "$chunk" --sizes "$size" --repeats "$repeats" \
        --seconds "$seconds" 2>>"$out.stderr" | tee -a "$out" >&2 || die "bench_allreduce failed (see $out.stderr)"
    done
  done
  echo
  header "Allreduce, float sum in place, $ranks ranks, median of $repeats batches, $((SECONDS - started)) s"
  echo "  (per size, raw, loom, loom-i, chunked, bf16, fp16 interleaved batch by batch in one mpirun -np $ranks, chunk-i in"
  echo "  a second one; batches of ~${seconds} s at 5 GB/s)"
  echo
  table_print "$out"
  echo "raw lines: $out"
}

# ---------------------------------------------------------------------------------------------
memory() {
  local out="$results-memory.txt" sizes=${MEM_SIZES:-256K,1M,2M,4M,8M,16M,32M,64M} started=$SECONDS
  : >"$out"
  for np in 1 2; do
    echo "run.sh: memory: $np process(es)" >&2
    quiet_wait
    "${mpi[@]}" -np "$np" "$bench" --memcpy --sizes "$sizes" --repeats 5 2>>"$out.stderr" | tee -a "$out" >&2
  done
  echo
  header "Memory bandwidth, GB/s of the size per operation, median of 5 per process, slowest process, $((SECONDS - started)) s"
  echo
  memory_print "$out"
  echo "raw lines: $out"
}

memory_print() {
  awk '
    function get(line, key,   n, i, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function add(list, k, v) { if (k in list) list[k] = list[k] "," v; else list[k] = v }  # comma-separated
    function size(b) { return (b + 0 >= 1048576) ? sprintf("%dM", b / 1048576) : sprintf("%dK", b / 1024) }
    /^mem:/ {
      b = get($0, "bytes"); p = get($0, "procs")
      if (!(b in seen)) { seen[b] = 1; order[++rows] = b }
      c[b, p] = get($0, "copy_gbs"); s[b, p] = get($0, "sum_gbs"); f[b, p] = get($0, "fresh_copy_gbs"); ff[b, p] = get($0, "fresh_faults")
    }
    END {
      printf "%6s | %27s | %27s\n", "", "1 process", "2 processes at once"
      printf "%6s | %6s %6s %6s %7s | %6s %6s %6s %7s\n", "size", "copy", "sum", "fresh", "faults", "copy", "sum", "fresh", "faults"
      for (i = 1; i <= rows; i++) {
        b = order[i]
        printf "%6s | %6s %6s %6s %7s | %6s %6s %6s %7s\n", size(b), c[b, 1], s[b, 1], f[b, 1], ff[b, 1], c[b, 2], s[b, 2], f[b, 2], ff[b, 2]
      }
      print ""
      print "copy: memcpy between two warm buffers; sum: dst[i] += src[i] (the reduction of MPI_SUM); fresh: malloc,"
      print "memcpy into it, free, per copy (what an allreduce that allocates its scratch buffer per call pays);"
      print "faults: minor page faults per fresh copy (glibc serves a malloc above its mmap threshold, at most 32 MiB,"
      print "with fresh zeroed pages every time)."
    }' "$@"
}

# ---------------------------------------------------------------------------------------------
algorithms() {
  local out="$results-algorithms.txt" sizes=${ALG_SIZES:-4K,64K,1M,16M,32M,64M} started=$SECONDS a r
  : >"$out"
  # Rounds: every configuration once per round, so that a burst of load hits all alike; the
  # medians are over every round's batches.
  for r in $(seq "$rounds"); do
    for a in 0 1 2 3 4 5 6; do
      echo "run.sh: algorithms: round $r, coll_tuned_allreduce_algorithm $a" >&2
      quiet_wait
      "${mpi[@]}" -np "$ranks" --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "$a" \
        "$bench" --variants raw --sizes "$sizes" --repeats 5 2>>"$out.stderr" | sed "s/^row:/row: family=tuned alg=$a/" |
        tee -a "$out" >&2
    done
    for a in 0 1 2 3 4; do
      echo "run.sh: algorithms: round $r, coll_libnbc_iallreduce_algorithm $a" >&2
      quiet_wait
      "${mpi[@]}" -np "$ranks" --mca coll_libnbc_iallreduce_algorithm "$a" \
        "$bench" --variants loom-i --sizes "$sizes" --repeats 5 2>>"$out.stderr" | sed "s/^row:/row: family=libnbc alg=$a/" |
        tee -a "$out" >&2
    done
  done
  echo
  header "Open MPI's allreduce algorithms, $ranks ranks, bus bandwidth GB/s (median of $rounds round(s) x 5 batches), $((SECONDS - started)) s"
  echo
  algorithms_print "$out"
  echo
  echo "Open MPI's fixed decision (coll_tuned_decision_fixed.c, used unless coll_tuned_use_dynamic_rules is set),"
  echo "for fewer than 4 ranks and a commutative op: below 4 KiB recursive doubling (3), 4-8 KiB ring (4), 8-16 KiB"
  echo "recursive doubling, 16-64 KiB ring, 64-256 KiB segmented ring (5), from 256 KiB rabenseifner (6)."
  echo "ompi_info --param coll tuned --level 9 lists only the switches that force an algorithm; the thresholds are"
  echo "compiled in. libnbc (MPI_Iallreduce) uses binomial (2) for fewer than 4 ranks or any in-place call."
  echo "raw lines: $out"
}

algorithms_print() {
  awk '
    function get(line, key,   n, i, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function add(list, k, v) { if (k in list) list[k] = list[k] "," v; else list[k] = v }  # comma-separated
    function size(b) { return (b + 0 >= 1048576) ? sprintf("%dM", b / 1048576) : sprintf("%dK", b / 1024) }
    function med(list,   n, a, i, j, t) {
      n = split(list, a, ",")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function fl(k, b) { return ((k, b) in flt) ? sprintf("%.0f", med(flt[k, b])) : "-" }
    /^row:/ {
      b = get($0, "bytes"); k = get($0, "family") get($0, "alg")
      if (!(b in seen)) { seen[b] = 1; order[++rows] = b }
      add(runs, k SUBSEP b, get($0, "runs_us"))
      add(flt, k SUBSEP b, get($0, "faults_per_call"))
      o = get($0, "others_cores"); if (!(b in oth) || o + 0 > oth[b] + 0) oth[b] = o
    }
    END {
      split("tuned0 tuned1 tuned2 tuned3 tuned4 tuned5 tuned6 libnbc0 libnbc1 libnbc2 libnbc3 libnbc4", keys, " ")
      printf "%6s | %-55s | %-34s |\n", "", "MPI_Allreduce: coll_tuned_allreduce_algorithm", "loom iallreduce: coll_libnbc_..."
      printf "%6s | %6s %6s %6s %6s %6s %6s %6s %6s | %6s %6s %6s %6s %6s | %6s  %s\n", "size", "0=own", "1=lin", "2=nov", "3=rd", \
        "4=ring", "5=seg", "6=rab", "best", "0=own", "1=ring", "2=bin", "3=rab", "4=rd", "others", "faults/call: own, 6=rab, libnbc own"
      for (i = 1; i <= rows; i++) {
        b = order[i]; best = ""; bt = 0
        line = sprintf("%6s |", size(b))
        for (j = 1; j <= 12; j++) {
          k = keys[j]
          if ((k, b) in runs) {
            t = med(runs[k, b]); v = b / t / 1000
            if (j >= 2 && j <= 7 && (best == "" || t < bt)) { best = substr(k, 6); bt = t }
            line = line sprintf(" %6.2f", v)
          } else line = line sprintf(" %6s", "-")
          if (j == 7) line = line sprintf(" %6s |", best)
        }
        if (oth[b] + 0 > 0.25) marked = 1
        printf "%s | %5s%s  %s, %s, %s\n", line, oth[b], (oth[b] + 0 > 0.25) ? "*" : " ", \
          fl("tuned0", b), fl("tuned6", b), fl("libnbc0", b)
      }
      print ""
      print "Columns: bus bandwidth GB/s; best: the fastest forced tuned algorithm (1 basic linear, 2 nonoverlapping"
      print "reduce+bcast, 3 recursive doubling, 4 ring, 5 segmented ring, 6 rabenseifner = reduce-scatter + allgather;"
      print "libnbc: 1 ring, 2 binomial = reduce to rank 0 + broadcast, 3 rabenseifner, 4 recursive doubling)."
      if (marked) print "* other processes kept more than 0.25 cores busy: noisy."
    }' "$@"
}

# ---------------------------------------------------------------------------------------------
malloc_sweep() {
  local out="$results-malloc.txt" started=$SECONDS r
  local nommap="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
  : >"$out"
  for r in $(seq "$rounds"); do
    echo "run.sh: malloc: round $r, glibc as is" >&2
    quiet_wait
    env -u GLIBC_TUNABLES "${mpi[@]}" -np "$ranks" "$bench" --variants raw,loom-i,chunked --chunk 16M \
      --sizes 8M,16M,32M,64M --repeats 5 2>>"$out.stderr" | sed 's/^row:/row: malloc=as-is/' | tee -a "$out" >&2
    echo "run.sh: malloc: round $r, GLIBC_TUNABLES=$nommap" >&2
    quiet_wait
    GLIBC_TUNABLES=$nommap "${mpi[@]}" -np "$ranks" -x GLIBC_TUNABLES "$bench" --variants raw,loom-i,chunked --chunk 16M \
      --sizes 8M,16M,32M,64M --repeats 5 2>>"$out.stderr" | sed 's/^row:/row: malloc=no-mmap/' | tee -a "$out" >&2
  done
  echo
  header "Per-call scratch memory: glibc malloc as is against mmap off ($nommap), $ranks ranks, median of $rounds round(s) x 5 batches, $((SECONDS - started)) s"
  echo
  malloc_print "$out"
  echo "raw lines: $out"
}

malloc_print() {
  awk '
    function get(line, key,   n, i, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function add(list, k, v) { if (k in list) list[k] = list[k] "," v; else list[k] = v }  # comma-separated
    function size(b) { return (b + 0 >= 1048576) ? sprintf("%dM", b / 1048576) : sprintf("%dK", b / 1024) }
    function med(list,   n, a, i, j, t) {
      n = split(list, a, ",")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    /^row:/ {
      b = get($0, "bytes"); v = get($0, "impl"); sub(/:.*/, "", v); k = get($0, "malloc") " " v
      if (!(b in seen)) { seen[b] = 1; order[++rows] = b }
      add(runs, k SUBSEP b, get($0, "runs_us"))
      add(flt, k SUBSEP b, get($0, "faults_per_call"))
      o = get($0, "others_cores"); if (!(b in oth) || o + 0 > oth[b] + 0) oth[b] = o
    }
    END {
      split("raw loom-i chunked", vs, " ")
      printf "%6s | %-32s | %-32s | %s\n", "", "glibc malloc as is", "mmap off (scratch reused)", ""
      printf "%6s | %10s %10s %10s | %10s %10s %10s | %s\n", "size", "raw", "loom-i", "chunked", "raw", "loom-i", "chunked", "others"
      for (i = 1; i <= rows; i++) {
        b = order[i]; line = sprintf("%6s |", size(b))
        for (m = 1; m <= 2; m++) {
          for (j = 1; j <= 3; j++) {
            k = (m == 1 ? "as-is " : "no-mmap ") vs[j]
            line = line (((k, b) in runs) ? sprintf(" %4.2f/%-5.0f", b / med(runs[k, b]) / 1000, med(flt[k, b])) : sprintf(" %10s", "-"))
          }
          line = line " |"
        }
        if (oth[b] + 0 > 0.25) marked = 1
        printf "%s %s%s\n", line, oth[b], (oth[b] + 0 > 0.25) ? "*" : ""
      }
      print ""
      print "Each cell: bus bandwidth GB/s / minor page faults per call. chunked: 16 MiB pieces."
      if (marked) print "* other processes kept more than 0.25 cores busy: noisy."
    }' "$@"
}

# ---------------------------------------------------------------------------------------------
# two_hosts_up [RATE]: 2 hosts of the multi-host harness with a hostfile of 1 slot each
# ($CLUSTER_DIR/hosts), each link limited to RATE by tc tbf when given. Exits 77 without root.
two_hosts_up() {
  [ "$(id -u)" = 0 ] || { echo "run.sh: the 2-host runs need root (ip netns, tc)" >&2; exit 77; }
  CLUSTER_PREFIX=${CLUSTER_PREFIX:-loomar}
  # shellcheck source=../../tests/cluster/harness.sh
  source "$repo/tests/cluster/harness.sh"
  cluster_up 2
  cluster_hostfile "$CLUSTER_DIR/hosts" 1
  if [ -n "${1:-}" ]; then cluster_limit 0 "$1" 4mbit; cluster_limit 1 "$1" 4mbit; fi
}

# The main table across 2 hosts of the multi-host harness (one rank each, TCP over veth).
cluster() {
  local repeats=5 seconds=0.1 chunk=16M sizes=64K,256K,1M,4M,16M,64M rate="" v size
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --repeats) repeats=$2; shift 2 ;;
      --seconds) seconds=$2; shift 2 ;;
      --chunk) chunk=$2; shift 2 ;;
      --sizes) sizes=$2; shift 2 ;;
      *) die "unknown flag $1 (see the top of $0)" ;;
    esac
  done
  [ "$ranks" = 2 ] || die "cluster runs 2 hosts x 1 rank (RANKS=$ranks)"
  two_hosts_up "$rate"
  local out="$results-cluster.txt" started=$SECONDS
  : >"$out"
  : >"$out.stderr"
  for size in ${sizes//,/ }; do
    for v in raw,loom,loom-i,chunked,bf16,fp16 chunked-i; do
      echo "run.sh: cluster: -np 2 --map-by node $bench --variants $v --sizes $size --repeats $repeats" >&2
      cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" --map-by node -np 2 -x OMP_NUM_THREADS=1 "$bench" --variants "$v" \
        --chunk "$chunk" --sizes "$size" --repeats "$repeats" --seconds "$seconds" 2>>"$out.stderr" | tee -a "$out" >&2 ||
        die "bench_allreduce failed across the hosts (see $out.stderr)"
    done
  done
  echo
  header "Allreduce over TCP, float sum in place, 2 hosts x 1 rank (network namespaces, veth, btl tcp,self; link $([ -n "$rate" ] && echo "limited to $rate by tc tbf" || echo "not limited")), median of $repeats batches, $((SECONDS - started)) s"
  echo
  table_print "$out"
  echo "raw lines: $out"
  cluster_down
  trap - EXIT
}

# ---------------------------------------------------------------------------------------------
reduce_scatter() {
  local repeats=5 seconds=0.1 sizes=64K,256K,1M,4M,16M,64M rate="" on_cluster=0 size out started=$SECONDS
  while [ $# -gt 0 ]; do
    case $1 in
      --cluster) on_cluster=1; shift ;;
      --rate) rate=$2; shift 2 ;;
      --repeats) repeats=$2; shift 2 ;;
      --seconds) seconds=$2; shift 2 ;;
      --sizes) sizes=$2; shift 2 ;;
      *) die "unknown flag $1 (see the top of $0)" ;;
    esac
  done
  out="$results-rs.txt"
  local run=("${mpi[@]}" -np "$ranks") where="$ranks ranks on one host (shared memory)"
  if [ "$on_cluster" = 1 ]; then
    two_hosts_up "$rate"
    run=(cluster_mpirun --hostfile "$CLUSTER_DIR/hosts" --map-by node -np 2 -x OMP_NUM_THREADS=1)
    where="2 hosts x 1 rank over TCP (network namespaces; link $([ -n "$rate" ] && echo "limited to $rate" || echo "not limited"))"
    out="$results-rs-cluster.txt"
  fi
  : >"$out"
  for size in ${sizes//,/ }; do
    echo "run.sh: reduce-scatter: ${run[*]} $bench --variants raw,rs-raw-b,rs-raw,rs-loom --sizes $size" >&2
    "${run[@]}" "$bench" --variants raw,rs-raw-b,rs-raw,rs-loom --sizes "$size" --repeats "$repeats" --seconds "$seconds" \
      2>>"$out.stderr" | tee -a "$out" >&2 || die "bench_allreduce failed (see $out.stderr)"
  done
  echo
  header "Reduce-scatter, float sum, $where, median of $repeats batches, $((SECONDS - started)) s"
  echo
  rs_print "$out"
  echo "raw lines: $out"
  if [ "$on_cluster" = 1 ]; then cluster_down; trap - EXIT; fi
}

rs_print() {
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
      lat[v, b] = get($0, "latency_us"); o = get($0, "others_cores"); if (!(b in oth) || o + 0 > oth[b] + 0) oth[b] = o
    }
    function cell(v, b) { return ((v, b) in lat) ? sprintf("%9.1f %5.2f", lat[v, b], lat[v, b] / lat["raw", b]) : sprintf("%9s %5s", "-", "-") }
    END {
      printf "%6s | %12s | %15s | %15s | %15s | %s\n", "", "MPI_Allreduce", "MPI_Reduce_sc.", "MPI_Ireduce_sc.", "loom ireduce_sc.", "others"
      printf "%6s | %12s | %9s %5s | %9s %5s | %9s %5s | %s\n", "size", "us", "us", "/ar", "us", "/ar", "us", "/ar", "cores"
      for (i = 1; i <= rows; i++) {
        b = order[i]
        printf "%6s | %12.1f | %s | %s | %s | %s\n", size(b), lat["raw", b], cell("rs-raw-b", b), cell("rs-raw", b), cell("rs-loom", b), oth[b]
        if (("rs-loom", b) in lat && ("rs-raw", b) in lat) { q = lat["rs-raw", b] / lat["rs-loom", b]; if (worst == "" || q < worst) { worst = q; ws = size(b) } }
      }
      print ""
      print "us: median time per call; /ar: that time over the MPI_Allreduce of the whole buffer (a reduce-scatter"
      print "moves half of what an allreduce does: 0.5 is the goal). MPI_Ireduce_sc. and loom are followed by a wait."
      if (worst != "") printf "loom ireduce_scatter_v against MPI_Ireduce_scatter: at least %.2fx as fast (lowest at %s)\n", worst, ws
    }' "$@"
}

# ---------------------------------------------------------------------------------------------
print_files() {
  local f
  for f in "$@"; do
    [ -f "$f" ] || die "no file $f"
    if grep -q '^mem:' "$f"; then memory_print "$f"
    elif grep -q 'family=' "$f"; then algorithms_print "$f"
    elif grep -q 'malloc=' "$f"; then malloc_print "$f"
    elif grep -q 'impl=rs-' "$f"; then rs_print "$f"
    else table_print "$f"; fi
    echo
  done
}

mode=all
case ${1:-} in
  all | table | memory | algorithms | malloc | cluster) mode=$1; shift ;;
  reduce-scatter) mode=reduce_scatter; shift ;;
  split-gradient) mode=split_gradient; shift ;;
  print) shift; print_files "$@"; exit 0 ;;
  -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
setup
case $mode in
  all)
    started=$SECONDS
    memory; echo; table "$@"; echo; algorithms; echo; malloc_sweep
    echo; echo "run.sh: all done in $((SECONDS - started)) s" ;;
  table) table "$@" ;;
  cluster) cluster "$@" ;;
  reduce_scatter) reduce_scatter "$@" ;;
  split_gradient)
    build bench_split_gradient
    header "split weight-gradient product, $ranks ranks over shared memory"
    "${strip_env[@]}" "${mpi[@]}" -np "$ranks" --bind-to none "$build_dir/benchmarks/allreduce/bench_split_gradient" "$@" ;;
  memory) memory ;;
  algorithms) algorithms ;;
  malloc) malloc_sweep ;;
esac
