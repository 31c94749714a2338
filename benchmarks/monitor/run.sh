#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What monitoring costs training: the mlp at batch 64 with every output on (Prometheus textfile,
# JSON lines, TensorBoard events, Chrome trace) against all off, in paired interleaved rounds.
#   run.sh [--batch 64] [--threads 1] [--rounds 31] [--seconds 1] [--every 1]
#       builds bench_monitor if needed and runs it (flags passed on); prints each round, the
#       median ratio on / off of samples per second (target >= 0.99), the same for the process's
#       CPU seconds (what waiting for a busy core does not inflate) and the CPU it ran on.
# Environment: LOOM_BUILD_DIR (default build/), LOOM_JOBS (default 1), RESULTS (file the raw
# lines go to; default $build_dir/monitor.txt), QUIET_WAIT (seconds to wait for an idle machine
# first; default 0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
jobs=${LOOM_JOBS:-1}
# strip_env, die, quiet_wait, build, cpu_line, field
source "$repo/benchmarks/common/lib.sh"

case ${1:-} in
  -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
args=(--rounds 31 --seconds 1 "$@")  # later flags win
build bench_monitor
results=${RESULTS:-$build_dir/monitor.txt}
quiet_wait
started=$SECONDS
"${strip_env[@]}" "$build_dir/benchmarks/monitor/bench_monitor" "${args[@]}" | tee "$results" >&2
line=$(grep '^monitor:' "$results")
echo
echo "Monitoring overhead, $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - started)) s, $(nproc) cores: $(cpu_line)"
echo "  on: Prometheus textfile + JSON lines + TensorBoard events every $(field "$line" every_s) s, Chrome trace;" \
  "off: none. Paired rounds of $(field "$line" steps) steps each, alternating which goes first."
printf '  %-28s %s\n' "median samples/s off:" "$(field "$line" median_off_samples_per_s)" \
  "median samples/s on:" "$(field "$line" median_on_samples_per_s)" \
  "median ratio on/off:" "$(field "$line" median_ratio) (rounds: $(field "$line" min_ratio) .. $(field "$line" max_ratio); target >= 0.99: $(field "$line" verdict))" \
  "median ratio, whole fit call:" "$(field "$line" median_call_ratio) (with the end-of-fit writes: trace, text summaries)" \
  "median CPU ratio off/on:" "$(field "$line" median_cpu_ratio) (the process's CPU seconds per fit call, end-of-fit writes included)" \
  "other processes:" "$(field "$line" others_cores) cores busy on average"
echo "raw lines: $results"
