# SPDX-License-Identifier: Apache-2.0
# What the benchmarks' run.sh scripts share; source it after setting `repo` (the repository
# root) and `jobs` (build parallelism). Gives: strip_env (a command prefix that removes the
# variables that tune BLAS / OpenMP: loom runs without any of them), die, quiet_wait, build,
# mpi_flags (mpirun's flags for N ranks here), field, median, cpu_line (the CPU model and vector ISA),
# openblas_choice (the OpenBLAS core type the tuned PyTorch peer forces, if any, and tuned_env,
# the command prefix of the tuned peer), cpu_header (the header lines naming the CPU).

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

# The median of the numbers given (the mean of the middle two for an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The CPU flag $1 is in /proc/cpuinfo (exit status). CPUINFO names another file to read instead,
# to see the choices below for another CPU.
has_cpu_flag() { grep -m1 '^flags' "${CPUINFO:-/proc/cpuinfo}" | tr ' ' '\n' | grep -qx "$1"; }

# The CPU's vector class from its flags: 3 AVX-512 (F, CD, BW, DQ, VL), 2 AVX2 + FMA, 1 AVX, 0 less.
cpu_vector_class() {
  local f avx512=1
  for f in avx512f avx512cd avx512bw avx512dq avx512vl; do has_cpu_flag $f || avx512=0; done
  if [ $avx512 = 1 ]; then echo 3
  elif has_cpu_flag avx2 && has_cpu_flag fma; then echo 2
  elif has_cpu_flag avx; then echo 1
  else echo 0; fi
}

# The CPU's model and vector ISA in one line, read from /proc/cpuinfo as loom's
# loom::detect_cpu_features does: "Intel(R) Xeon(R) Processor; AVX-512 with avx512_bf16, no AMX".
cpu_line() {
  local model isa
  model=$(sed -n 's/^model name[[:space:]]*: //p' "${CPUINFO:-/proc/cpuinfo}" | head -n1)
  case $(cpu_vector_class) in
    3) isa="AVX-512"
       if has_cpu_flag avx512_bf16; then isa+=" with avx512_bf16"; else isa+=", no avx512_bf16"; fi ;;
    2) isa="AVX2, no AVX-512" ;;
    *) isa="no AVX2" ;;
  esac
  if has_cpu_flag amx_tile && has_cpu_flag amx_bf16; then isa+=", AMX (amx_bf16)"; else isa+=", no AMX"; fi
  echo "${model:-unknown CPU}; $isa"
}

# The OpenBLAS kernel core that Python $1 (Debian's python3, whose torch uses the system
# libblas.so.3) gets with the environment given after it, e.g. `blas_core "$py" OPENBLAS_CORETYPE=Haswell`;
# "-" when that BLAS is not OpenBLAS or does not know the core asked for.
blas_core() {
  local py=$1 out
  shift
  out=$("${strip_env[@]}" OPENBLAS_VERBOSE=1 "$@" "$py" -c 'import ctypes
try:
    f = ctypes.CDLL("libblas.so.3").openblas_get_corename
except (OSError, AttributeError):
    print("-")
else:
    f.restype = ctypes.c_char_p
    print(f().decode())' 2>&1) || { echo "-"; return 0; }
  case $out in
    *"Core not found"*) echo "-" ;;  # OpenBLAS's words for an OPENBLAS_CORETYPE it does not know
    *) printf '%s\n' "$out" | tail -n1 ;;
  esac
}

# Sets blas_forced (the OPENBLAS_CORETYPE the tuned PyTorch peer runs with, empty for none),
# blas_detected (the core OpenBLAS picks by itself here) and blas_reason (a sentence for the
# header), for Python $1. OpenBLAS picks its kernels from the CPU's model number, and Debian 12's
# 0.3.21 falls back to Prescott (SSE3, about 4x slower) on models newer than it knows, e.g. an
# Emerald Rapids Xeon (family 6 model 207). A core is forced only when OpenBLAS's own pick is of
# a lower class than the CPU's flags (SSE < AVX < AVX2 < AVX-512), and then it is the best core
# those flags run: Cooperlake (AVX-512 with avx512_bf16; for sgemm the same kernels as SkylakeX),
# SkylakeX (AVX-512), Haswell (AVX2 + FMA), Sandybridge (AVX). Never one the CPU cannot run;
# never one this OpenBLAS does not know (it must report the forced name back).
openblas_choice() {
  local py=$1 cpu_class blas_class want f
  blas_forced="" blas_reason=""
  blas_detected=$(blas_core "$py")
  if [ "$blas_detected" = "-" ]; then
    blas_reason="torch's BLAS is not OpenBLAS"
    return 0
  fi
  cpu_class=$(cpu_vector_class)
  case $blas_detected in
    SkylakeX | Cooperlake | SapphireRapids) blas_class=3 ;;
    Haswell | Zen | Excavator) blas_class=2 ;;
    Sandybridge | Bulldozer | Piledriver | Steamroller) blas_class=1 ;;
    *) blas_class=0 ;;
  esac
  if [ $blas_class -ge $cpu_class ]; then
    blas_reason="OpenBLAS alone picks $blas_detected here, which fits this CPU"
    return 0
  fi
  case $cpu_class in
    3) if has_cpu_flag avx512_bf16; then want="Cooperlake SkylakeX"; else want="SkylakeX"; fi ;;
    2) want="Haswell" ;;
    1) want="Sandybridge" ;;
  esac
  for f in $want; do
    if [ "$(blas_core "$py" OPENBLAS_CORETYPE="$f")" = "$f" ]; then
      blas_forced=$f
      blas_reason="OpenBLAS alone picks $blas_detected here: misdetected"
      return 0
    fi
  done
  blas_reason="OpenBLAS alone picks $blas_detected here, and knows none of $want"
}

# Sets tuned_env, the command prefix of the tuned PyTorch peer for Python $1: strip_env, then
# OPENBLAS_CORETYPE where openblas_choice forces one, OPENBLAS_NUM_THREADS=$2 (OpenBLAS's own
# threads would fight PyTorch's OpenMP threads for the cores). OPENBLAS_L2_SIZE stays unset
# (strip_env removes it where the machine sets it).
tuned_blas_env() {
  openblas_choice "$1"
  tuned_env=("${strip_env[@]}")
  [ -z "$blas_forced" ] || tuned_env+=(OPENBLAS_CORETYPE="$blas_forced")
  tuned_env+=(OPENBLAS_NUM_THREADS="$2")
}

# The tuned peer's BLAS settings in words, for a header (after tuned_blas_env).
tuned_blas_words() {
  if [ -n "$blas_forced" ]; then echo "OPENBLAS_CORETYPE=$blas_forced ($blas_reason)"
  else echo "OPENBLAS_CORETYPE unset ($blas_reason)"; fi
}

# Header lines naming the CPU, from the `cpu: impl=NAME ...` lines that the loom programs and the
# PyTorch peers print into raw-lines file $1: one per implementation (the first of each).
cpu_header() {
  awk '/^cpu: impl=/ { impl = substr($2, 6); v = ""
         if ($3 ~ /^variant=/) { v = " " substr($3, 9); $3 = "" }
         $1 = ""; $2 = ""; sub(/^ +/, ""); k = impl v
         if (!(k in seen)) { seen[k] = 1; printf "  %-23s%s\n", "CPU (" k "):", $0 } }' "$1"
}
