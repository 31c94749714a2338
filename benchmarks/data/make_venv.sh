#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes the Python environment of the data benchmark's PyTorch peer: current PyTorch and
# torchvision from PyPI, pinned to one matching pair (torchvision 0.29 is built against torch
# 2.14; its image extension, where decode_jpeg lives, does not load into another torch), with
# Pillow and numpy. PyTorch's CPU-only wheel index is used when it is reachable (a few hundred
# MB); otherwise plain PyPI, whose Linux wheels bring CUDA's libraries (several GB) that the
# benchmark never loads onto a GPU.
#
#   bash benchmarks/data/make_venv.sh [DIR]     default DIR: $LOOM_DATA_VENV or ~/.cache/loom/data-bench-venv
#
# Prints the versions installed. Running it again on a finished environment does nothing more.
set -euo pipefail

venv=${1:-${LOOM_DATA_VENV:-$HOME/.cache/loom/data-bench-venv}}
python=${PYTHON:-/usr/bin/python3}
torch_pin=${TORCH_PIN:-torch==2.14.*}
vision_pin=${TORCHVISION_PIN:-torchvision==0.29.*}
cpu_index=https://download.pytorch.org/whl/cpu

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, torchvision, PIL, numpy' 2>/dev/null; then
  "$venv/bin/pip" install --quiet --upgrade pip
  if "$venv/bin/python" - "$cpu_index" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=15)
except Exception:
    sys.exit(1)
PY
  then
    echo "make_venv.sh: PyTorch's CPU wheel index is reachable: CPU-only wheels" >&2
    "$venv/bin/pip" install --quiet --index-url "$cpu_index" --extra-index-url https://pypi.org/simple \
      "$torch_pin" "$vision_pin" pillow numpy
  else
    echo "make_venv.sh: PyTorch's CPU wheel index is not reachable: PyPI's wheels (with CUDA's libraries, several GB)" >&2
    "$venv/bin/pip" install --quiet "$torch_pin" "$vision_pin" pillow numpy
  fi
fi
"$venv/bin/python" -c 'import torch, torchvision, PIL, numpy
print("venv:", __import__("sys").prefix)
print("torch", torch.__version__, "torchvision", torchvision.__version__, "pillow", PIL.__version__, "numpy", numpy.__version__)'
