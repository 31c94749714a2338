#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Decoding and augmenting images: loom against PyTorch + torchvision on the same files.
#
#   run.sh [--rounds 5] [--seconds 2] [--threads 1,2] [--what jpeg,png] [--quick]
#   run.sh table FILE          the table again from the raw lines of an earlier run
#
# Rows: `one` = one thread decoding sample after sample; `pool` = end to end with N threads:
# loom's batch_prefetch against torch.utils.data.DataLoader with N worker processes, batches
# of 64 in a shuffled order (collation and the workers' IPC included), images/s and per core.
# jpeg: 256 x 256 JPEGs (quality 90) -> random_resized_crop 224, flip, ImageNet normalize;
# png: Fashion-MNIST's 28 x 28 grey PNGs -> pixel / 255. Peers: `pil` (PIL decode +
# torchvision.transforms) and `tv` (torchvision.io.decode_jpeg / decode_png + transforms.v2).
# Each round runs every program once (in an order that alternates), each program measures for
# --seconds after a warm-up; the table shows the median over the rounds.
#
# Needs: Debian's python3-skimage and python3-pil (to make the JPEGs from skimage.data's colour
# photos) and dataset-fashion-mnist (the PNGs); the peer's venv with PyTorch and torchvision from
# PyPI (made by make_venv.sh when missing). Environment: LOOM_BUILD_DIR (default build/),
# LOOM_JOBS (default 1), LOOM_DATA_VENV (default ~/.cache/loom/data-bench-venv), LOOM_DATA_PHOTOS
# (default $LOOM_BUILD_DIR/data-bench-photos), RESULTS (the raw lines' file).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, build, field, cpu_header
source "$repo/benchmarks/common/lib.sh"

# The table from the raw `row:` lines of file $1: medians over the rounds.
table() {
  awk '
    function get(line, key,   n, i, a) {
      n = split(line, a, " ")
      for (i = 1; i <= n; i++) if (index(a[i], key "=") == 1) return substr(a[i], length(key) + 2)
      return ""
    }
    function median(list,   n, a, i, j, t) {
      n = split(list, a, ",")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n == 0 ? "" : (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2)
    }
    function ratio(x, y) { return (x != "" && y != "" && y + 0 > 0) ? sprintf("%.2f", x / y) : "-" }
    /^row:/ {
      k = get($0, "what") " " get($0, "mode") " " get($0, "threads")
      if (!(k in seen)) { seen[k] = 1; order[++rows] = k }
      v = get($0, "variant"); key = k SUBSEP v
      rate[key] = rate[key] (rate[key] == "" ? "" : ",") get($0, "images_per_s")
      cnt[key]++
      o = get($0, "others_cores"); if (o != "" && o + 0 > busy[k] + 0) busy[k] = o
    }
    END {
      printf "%-5s %-5s %7s %10s %10s %10s %9s %8s %10s %11s %7s %6s\n", "what", "mode", "threads", "loom", "torch-pil", \
        "torch-tv", "loom/pil", "loom/tv", "loom/core", "torch/core", "rounds", "others"
      for (r = 1; r <= rows; r++) {
        k = order[r]; split(k, p, " ")
        l = median(rate[k SUBSEP "loom"]); pl = median(rate[k SUBSEP "pil"]); tv = median(rate[k SUBSEP "tv"])
        best = (pl + 0 > tv + 0) ? pl : tv
        printf "%-5s %-5s %7s %10.0f %10.0f %10.0f %9s %8s %10.0f %11.0f %7s %6s\n", p[1], p[2], p[3], l, pl, tv, \
          ratio(l, pl), ratio(l, tv), l / p[3], best / p[3], cnt[k SUBSEP "loom"], (k in busy) ? busy[k] : "-"
        if (p[1] == "jpeg" && p[2] == "one")
          targets = targets sprintf("  one thread, JPEG: loom / decode_jpeg + v2 = %s %s\n", ratio(l, tv), \
                                    (tv + 0 > 0 && l / tv >= 1.5) ? "(meets >= 1.5)" : "(misses >= 1.5)")
        if (p[2] == "pool")
          targets = targets sprintf("  %s end to end, %s threads: loom / DataLoader (the faster peer) per core = %s %s\n", \
                                    p[1], p[3], ratio(l, best), (best + 0 > 0 && l / best >= 2) ? "(meets >= 2)" : "(misses >= 2)")
      }
      printf "\ntargets:\n%s", targets
    }' "$1"
}

if [ "${1:-}" = table ]; then
  table "$2"
  exit 0
fi

rounds=5 seconds=2 threads=1,2 whats=jpeg,png
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --what) whats=$2; shift 2 ;;
    --quick) rounds=3; seconds=1; shift ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
done

venv=${LOOM_DATA_VENV:-$HOME/.cache/loom/data-bench-venv}
[ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch, torchvision' 2>/dev/null ||
  bash "$here/make_venv.sh" "$venv" >&2 || die "making the peer's venv in $venv failed (see make_venv.sh)"
py=$venv/bin/python

build bench_data
bench="$build_dir/benchmarks/data/bench_data"
photos=${LOOM_DATA_PHOTOS:-$build_dir/data-bench-photos}
if [ ! -f "$photos/README.txt" ]; then
  /usr/bin/python3 -c 'import skimage, PIL' 2>/dev/null || die "making the photos needs Debian's python3-skimage and python3-pil"
  /usr/bin/python3 "$here/make_photos.py" "$photos" --count 2000 --size 256 --quality 90 --seed 1 --png-count 10000 >&2
fi
[ -d "$photos/png" ] || whats=${whats//png/}
results=${RESULTS:-$build_dir/data-bench.txt}
: >"$results"
: >"$results.stderr"

run_loom() { "${strip_env[@]}" "$bench" --dir "$photos/$1" --what "$1" --mode "$2" --threads "$3" --seconds "$seconds" --repeats 1 2>>"$results.stderr" | tee -a "$results" >&2; }
run_peer() { "${strip_env[@]}" "$py" "$here/torch_peer.py" --dir "$photos/$2" --variant "$1" --what "$2" --mode "$3" --threads "$4" --seconds "$seconds" --repeats 1 2>>"$results.stderr" | tee -a "$results" >&2; }

started=$SECONDS
n=0
for r in $(seq 1 "$rounds"); do
  for what in ${whats//,/ }; do
    for mode_threads in one:1 $(for t in ${threads//,/ }; do echo "pool:$t"; done); do
      mode=${mode_threads%:*} t=${mode_threads#*:}
      echo "run.sh: round $r/$rounds, $what $mode $t thread(s) [$((SECONDS - started)) s]" >&2
      if [ $((n % 2)) = 0 ]; then
        run_loom "$what" "$mode" "$t"; run_peer tv "$what" "$mode" "$t"; run_peer pil "$what" "$mode" "$t"
      else
        run_peer pil "$what" "$mode" "$t"; run_peer tv "$what" "$mode" "$t"; run_loom "$what" "$mode" "$t"
      fi
      n=$((n + 1))
    done
  done
done

echo
echo "Decoding and augmentation, images/s (median of $rounds rounds of ~${seconds} s after a warm-up; $(nproc) cores), $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - started)) s"
cpu_header "$results"
echo "  versions:              $(grep -m1 '^versions: impl=loom' "$results" | cut -d' ' -f3-)"
echo "                         $(grep -m1 '^versions: impl=torch' "$results" | cut -d' ' -f3-)"
echo "  files:                 $(head -n1 "$photos/README.txt")"
echo "  jpeg: 256 x 256 JPEG q90 -> random resized crop 224, flip, normalize (CHW float); png: 28 x 28 grey PNG -> / 255."
echo "  one = one thread; pool = loom batch_prefetch / torch DataLoader with N workers, batch 64, shuffled."
echo "  torch/core: the faster peer's. 'others' = cores other processes kept busy during loom's runs (the most)."
echo
table "$results"
echo
echo "raw lines: $results"
