#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CPU seconds (user + sys) to compile each translation unit of the examples, one g++ process
# at a time: once with the build's own flags (CMAKE_BUILD_TYPE Release: -O3) and once at -O2,
# and each example's sum; examples/common/example.cpp (the flags and the result line, shared by
# the three examples and compiled once for all) is reported on its own, as example=common.
# Not a timed test: run it by hand (see benchmarks/README.md).
#
#   run.sh                 every TU under examples/, both flag sets
#   run.sh pipeline        only the TUs whose path contains "pipeline" (any substring)
#   run.sh --repeats 3 ... best of 3 runs per TU and flag set (default 1)
#   run.sh --flags O2      only the -O2 figures (or: --flags build)
#
# The commands are the build's own (ninja -t compdb of LOOM_BUILD_DIR, default build/,
# configured Release if it does not exist yet), with the object written to a temporary file.
# CPU time, not wall time: on a shared machine waiting for a core does not count.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_dir=${LOOM_BUILD_DIR:-$repo/build}
repeats=1
flag_sets=(build O2)
filter=""

die() { echo "compile_time: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case $1 in
    --repeats) repeats=${2:?}; shift 2 ;;
    --flags) flag_sets=("${2:?}"); shift 2 ;;
    -h | --help) sed -n '3,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    -*) die "unknown flag $1 (see --help)" ;;
    *) filter=$1; shift ;;
  esac
done

command -v ninja >/dev/null || die "needs ninja (the commands come from ninja -t compdb)"
if [ ! -f "$build_dir/build.ninja" ]; then
  echo "compile_time: configuring $build_dir (Release, Ninja)" >&2
  cmake -S "$repo" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi

# One line per example TU: directory <TAB> source <TAB> the command, as a shell-quoted string.
mapfile -t entries < <(ninja -C "$build_dir" -t compdb 2>/dev/null | python3 -c '
import json, shlex, sys
for e in json.load(sys.stdin):
    f = e["file"]
    if "/examples/" not in f or not f.endswith(".cpp") or "-c" not in e.get("command", ""):
        continue
    print(e["directory"] + "\t" + f + "\t" + e["command"])
' | grep -F -- "$filter" | sort -t$'\t' -k2)
[ ${#entries[@]} -gt 0 ] || die "no example TU matches '$filter' in $build_dir"

obj=$(mktemp --suffix=.o)
times=$(mktemp)
log=$(mktemp)
trap 'rm -f "$obj" "$times" "$log"' EXIT

# cpu_seconds DIR COMMAND...: best user+sys over $repeats runs.
cpu_seconds() {
  local dir=$1 best="" i s user sys; shift
  for ((i = 0; i < repeats; i++)); do
    (cd "$dir" && /usr/bin/time -o "$times" -f '%U %S' "$@" >"$log" 2>&1) ||
      { cat "$log" >&2; die "the compiler failed: $*"; }
    read -r user sys < <(tail -n1 "$times")
    s=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", u + s }')
    if [ -z "$best" ] || awk -v a="$s" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$s; fi
  done
  echo "$best"
}

declare -A total
echo "compiler: $(${CXX:-g++} --version | head -n1); $(nproc) cores; best of $repeats run(s) per figure" >&2
for entry in "${entries[@]}"; do
  IFS=$'\t' read -r dir file command <<<"$entry"
  eval "args=($command)"
  # Write the object elsewhere, and no dependency file.
  cmd=()
  skip=0
  for a in "${args[@]}"; do
    if [ $skip -gt 0 ]; then skip=$((skip - 1)); continue; fi
    case $a in
      -o) skip=1 ;;
      -MD) ;;
      -MT | -MF) skip=1 ;;
      *) cmd+=("$a") ;;
    esac
  done
  cmd+=(-o "$obj")
  rel=${file#"$repo"/}
  example=$(echo "$rel" | cut -d/ -f2)
  line="compile-time: tu=$rel"
  for set in "${flag_sets[@]}"; do
    case $set in
      build) c=("${cmd[@]}") ;;
      O2) c=("${cmd[@]}" -O2) ;;  # the last -O wins
      *) die "--flags is build or O2, not $set" ;;
    esac
    s=$(cpu_seconds "$dir" "${c[@]}")
    line+=" ${set}_cpu_s=$s"
    total[$example,$set]=$(awk -v a="${total[$example,$set]:-0}" -v b="$s" 'BEGIN { printf "%.1f", a + b }')
  done
  echo "$line"
done
for example in $(printf '%s\n' "${entries[@]}" | cut -f2 | sed "s|^$repo/||" | cut -d/ -f2 | sort -u); do
  line="compile-time: example=$example"
  for set in "${flag_sets[@]}"; do line+=" ${set}_cpu_s=${total[$example,$set]}"; done
  if [ "$example" = common ]; then
    echo "$line (examples/common: the three examples' shared code, compiled once for all of them)"
  else
    echo "$line (sum over its TUs; the build runs them in parallel)"
  fi
done
