# SPDX-License-Identifier: Apache-2.0
"""loom's resnet<18> export in ONNX Runtime: onnx's checker passes and the logits are loom's.

check_onnx_resnet.py DIR   (after models_fixtures write DIR): runs resnet18.onnx on the input of
resnet18.io.safetensors; max |difference| at most 1e-5 of the largest logit. Exits 77 (skipped)
without onnx and onnxruntime."""

import json
import os
import struct
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print(f"check_onnx_resnet.py: {e}: skipped")
    sys.exit(77)

TOLERANCE = 1e-5


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, e in header.items():
        if name != "__metadata__":
            b, en = e["data_offsets"]
            out[name] = np.frombuffer(blob[8 + n + b:8 + n + en], dtype=np.float32).reshape(e["shape"])
    return out


def main(d):
    path = os.path.join(d, "resnet18.onnx")
    onnx.checker.check_model(onnx.load(path))
    io = load(os.path.join(d, "resnet18.io.safetensors"))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    y = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, {"input": io["input"]})[0]
    diff = float(np.abs(y - io["logits"]).max())
    rel = diff / float(np.abs(io["logits"]).max())
    print(f"ONNX Runtime runs loom's resnet18: max |ONNX Runtime - loom| logit {diff:.3g}, relative to the largest {rel:.3g}")
    return 0 if rel <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
