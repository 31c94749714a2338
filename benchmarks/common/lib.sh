# SPDX-License-Identifier: Apache-2.0
# What the benchmarks' run.sh scripts share; source it after setting `repo` (the repository
# root) and `jobs` (build parallelism). Gives: strip_env (a command prefix that removes the
# variables that tune BLAS / OpenMP: loom runs without any of them), die, quiet_wait, build,
# mpi_flags (mpirun's flags for N ranks here), field.

strip_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS -u OPENBLAS_VERBOSE
  -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u OMP_PROC_BIND -u OMP_PLACES -u GOMP_SPINCOUNT
  -u MKL_NUM_THREADS -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA -u ONEDNN_VERBOSE -u DNNL_VERBOSE)

die() { echo "run.sh: $*" >&2; exit 1; }

# QUIET_WAIT=S: before each measurement, wait up to S seconds for the machine to be idle (other
# processes using under 0.3 cores over 2 s): on a shared machine this moves the runs into the
# quiet spells. 0 (default): do not wait.
quiet_wait() {
  local limit=${QUIET_WAIT:-0} waited=0 a b busy
  [ "$limit" -gt 0 ] 2>/dev/null || return 0
  while :; do
    read -r -a a < <(head -n1 /proc/stat)
    sleep 2
    read -r -a b < <(head -n1 /proc/stat)
    busy=$(( (b[1] + b[2] + b[3] + b[6] + b[7]) - (a[1] + a[2] + a[3] + a[6] + a[7]) ))  # ticks in 2 s
    [ $((busy * 100 / (2 * $(getconf CLK_TCK)))) -ge 30 ] || return 0
    [ $waited -lt "$limit" ] || { echo "run.sh: machine still busy after ${waited} s; measuring anyway" >&2; return 0; }
    waited=$((waited + 2))
  done
}

# Builds the targets given into $build_dir (configuring it first if needed); sets build_dir.
build() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  build_dir=${LOOM_BUILD_DIR:-$repo/build}
  local log
  log=$(mktemp)
  if { [ -f "$build_dir/CMakeCache.txt" ] ||
       cmake -S "$repo" -B "$build_dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$log" 2>&1; } &&
     cmake --build "$build_dir" -j "$jobs" --target "$@" >"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  [ -z "${LOOM_BUILD_DIR:-}" ] || { tail -n 20 "$log" >&2; die "building $* in $build_dir failed"; }
  tail -n 5 "$log" >&2
  echo "run.sh: building in $build_dir failed (other work in progress?); trying $repo/build-bench without tests" >&2
  build_dir=$repo/build-bench
  [ -f "$build_dir/CMakeCache.txt" ] ||
    cmake -S "$repo" -B "$build_dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF >&2 ||
    die "configuring $build_dir failed"
  cmake --build "$build_dir" -j "$jobs" --target "$@" >&2 || die "building $* in $build_dir failed"
  rm -f "$log"
}

# mpirun's flags for $1 ranks on this machine: --allow-run-as-root as root, --oversubscribe for
# more ranks than cores.
mpi_flags() {
  local f=(-np "$1")
  [ "$(id -u)" -ne 0 ] || f+=(--allow-run-as-root)
  [ "$1" -le "$(nproc)" ] || f+=(--oversubscribe)
  printf '%s\n' "${f[@]}"
}

# The value of key $2 in a `key=value ...` line $1.
field() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1; }
