# SPDX-License-Identifier: Apache-2.0
"""The main job's export predicts as loom does: ONNX Runtime runs the ONNX file that
`fashion_mnist --epochs 1 --export-onnx MODEL` wrote on the 10,000 Fashion-MNIST test images, and
its class for each must be loom's (written by `io_fixtures predict`) for at least 99.9% of them.

usage: check_main_job.py MODEL LOOM_CLASSES DATA_DIR
"""
import gzip
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from common import cli, finish
except ImportError as e:
    sys.exit(f"check_main_job.py: {e}: the io tests' Python environment is incomplete; run `bash scripts/setup`")


def test_images(d):
    with gzip.open(f"{d}/t10k-images-idx3-ubyte.gz", "rb") as f:
        raw = f.read()
    n, rows, cols = (int.from_bytes(raw[4 * i:4 * i + 4], "big") for i in (1, 2, 3))
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows * cols)
    return pixels.astype(np.float32) / np.float32(255)  # as loom's loaders: pixel / 255


def main(model, classes_path, data):
    x = test_images(data)
    loom_classes = np.fromfile(classes_path, dtype=np.uint8)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    y = np.concatenate([sess.run(["output"], {"input": x[i:i + 1000]})[0] for i in range(0, len(x), 1000)])
    ort_classes = y.argmax(axis=1)
    if len(loom_classes) != len(ort_classes):
        print(f"check_main_job.py: {len(loom_classes)} classes from loom, {len(ort_classes)} images")
        return 1
    same = int((ort_classes == loom_classes).sum())
    share = same / len(ort_classes)
    print(f"ONNX Runtime and loom predict the same class for {same} of {len(ort_classes)} test images ({100 * share:.2f}%)")
    return finish("check_main_job.py", 0 if share >= 0.999 else 1, "at least 99.9% agree")


if __name__ == "__main__":
    cli(main, __doc__, 3)
