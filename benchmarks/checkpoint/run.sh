#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What checkpoints cost: builds bench_checkpoint if needed, runs it and PyTorch's peer
# (torch_peer.py on /usr/bin/python3, when it has torch), and prints three tables:
#   save / load  trainer::save (synchronous, fsynced, committed) and trainer::load of the mlp, the
#                cnn and a 100.7 M-parameter network: seconds, MB/s, and the ratio of bytes/s to a
#                raw write() + fsync (read) of the same bytes in the same process; torch.save /
#                torch.load of the same tensors likewise;
#   overhead     the mlp at batch 64 with a checkpoint every 20 / 100 / 500 steps, async and not,
#                against none: median ratio of samples/s over paired rounds (target >= 0.99 at 100);
#   reshard      loads between 1 process and data_parallel on 2 ranks (local_world threads).
#   run.sh [--part save,overhead,reshard] [--model mlp,cnn,big] [--repeats 5] [--big-repeats 3]
#          [--rounds 7] [--steps 1000] [--dir DIR]      (flags go to bench_checkpoint)
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (default 1), RESULTS (file the raw lines
# go to; default $build_dir/checkpoint.txt), TORCH_PYTHON (default /usr/bin/python3; NO_TORCH=1
# to skip the peer), QUIET_WAIT (seconds to wait for an idle machine first; default 0).
# Needs about 3 GiB of free disk where checkpoints go ($TMPDIR or /tmp; --dir) and 6 GiB of memory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, quiet_wait, build, cpu_header, field
source "$repo/benchmarks/common/lib.sh"

case ${1:-} in
  -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
args=("$@")
flag() {  # the value of flag --$1 in the arguments, or $2
  local i
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do [ "${args[i]}" != "--$1" ] || { echo "${args[i + 1]}"; return; }; done
  echo "$2"
}
parts=$(flag part save,overhead,reshard)
models=$(flag model mlp,cnn,big)
build bench_checkpoint
results=${RESULTS:-$build_dir/checkpoint.txt}
py=${TORCH_PYTHON:-/usr/bin/python3}
quiet_wait
started=$SECONDS
"${strip_env[@]}" "$build_dir/benchmarks/checkpoint/bench_checkpoint" "${args[@]}" | tee "$results" >&2
if [[ $parts == *save* && -z ${NO_TORCH:-} ]] && "$py" -c 'import torch' 2>/dev/null; then
  tdir=$(flag dir "${TMPDIR:-/tmp}")
  "${strip_env[@]}" OPENBLAS_NUM_THREADS=1 "$py" "$here/torch_peer.py" --model "$models" \
    --repeats "$(flag repeats 5)" --big-repeats "$(flag big-repeats 3)" --dir "$tdir" | tee -a "$results" >&2
fi

echo
echo "Checkpoints, $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - started)) s, $(nproc) cores; checkpoints in $(grep -m1 '^dir:' "$results" | cut -d' ' -f2- | xargs dirname)"
cpu_header "$results"
if grep -q '^save:' "$results"; then
  echo
  echo "Save (synchronous, fsynced, committed) and load, medians; ratio = bytes/s over a raw write()+fsync / pread of the same bytes (1 = the disk's rate)"
  printf '  %-5s %-6s %11s | %8s %7s %7s %6s | %8s %7s %6s | %8s %7s %6s\n' impl model bytes save_s MB/s raw_MB/s ratio \
    warm_s MB/s ratio cold_s MB/s ratio
  while read -r line; do
    m=$(field "$line" model)
    ld=$(grep "^load: model=$m " "$results")
    printf '  %-5s %-6s %11s | %8s %7s %7s %6s | %8s %7s %6s | %8s %7s %6s\n' loom "$m" "$(field "$line" bytes)" \
      "$(field "$line" save_s)" "$(field "$line" save_mb_s)" "$(field "$line" raw_write_mb_s)" "$(field "$line" ratio)" \
      "$(field "$ld" warm_s)" "$(field "$ld" warm_mb_s)" "$(field "$ld" warm_ratio)" \
      "$(field "$ld" cold_s)" "$(field "$ld" cold_mb_s)" "$(field "$ld" cold_ratio)"
    if tl=$(grep "^torch_save: model=$m " "$results"); then
      printf '  %-5s %-6s %11s | %8s %7s %7s %6s | %8s %7s %6s | %8s %7s %6s\n' torch "$m" "$(field "$tl" bytes)" \
        "$(field "$tl" save_s)" "$(field "$tl" save_mb_s)" "$(field "$tl" raw_write_mb_s)" "$(field "$tl" ratio)" \
        "$(field "$tl" warm_s)" "$(field "$tl" warm_mb_s)" "$(field "$tl" warm_ratio)" \
        "$(field "$tl" cold_s)" "$(field "$tl" cold_mb_s)" "$(field "$tl" cold_ratio)"
    fi
  done < <(grep '^save:' "$results")
  grep '^components:' "$results" | sed 's/^/  /' || true
fi
if grep -q '^overhead:' "$results"; then
  echo
  line=$(grep -m1 '^overhead:' "$results")
  echo "Training with checkpoints: mlp, batch $(field "$line" batch), $(field "$line" rounds) paired rounds of $(field "$line" steps) steps;" \
    "no checkpoints: $(field "$line" off_samples_per_s) samples/s (median)"
  printf '  %-9s %6s %6s %10s %8s %17s %9s %10s\n' config every async samples/s ratio "rounds min..max" cpu_ratio ms/ckpt
  while read -r line; do
    printf '  %-9s %6s %6s %10s %8s %17s %9s %10s\n' "$(field "$line" config)" "$(field "$line" every)" "$(field "$line" async)" \
      "$(field "$line" on_samples_per_s)" "$(field "$line" median_ratio)" \
      "$(field "$line" min_ratio)..$(field "$line" max_ratio)" "$(field "$line" median_cpu_ratio)" "$(field "$line" per_checkpoint_ms)"
  done < <(grep '^overhead:' "$results")
  v=$(grep 'config=async100 ' "$results")
  echo "  target: ratio >= 0.99 with a checkpoint every 100 steps (async): $(field "$v" verdict);" \
    "other processes kept $(field "$v" others_cores) cores busy on average"
fi
if grep -q '^reshard:' "$results"; then
  echo
  echo "Load + reshard (data_parallel on 2 ranks = 2 threads of a local_world; from the page cache), medians, seconds"
  printf '  %-5s %11s | %7s %7s | %7s %7s %7s %7s | %s\n' model parameters save_1 save_2 "1->1" "2->1" "2->2" "1->2" checked
  while read -r line; do
    printf '  %-5s %11s | %7s %7s | %7s %7s %7s %7s | %s\n' "$(field "$line" model)" "$(field "$line" parameters)" \
      "$(field "$line" save_1_s)" "$(field "$line" save_2_s)" "$(field "$line" load_1_to_1_s)" "$(field "$line" load_2_to_1_s)" \
      "$(field "$line" load_2_to_2_s)" "$(field "$line" load_1_to_2_s)" "$(field "$line" verified)"
  done < <(grep '^reshard:' "$results")
fi
echo "raw lines: $results"
