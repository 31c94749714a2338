# SPDX-License-Identifier: Apache-2.0
"""Checks loom's ONNX exports (written by `io_fixtures write DIR`) with the real readers.

For every case: onnx.checker.check_model(full_check=True) passes for each export; the model is
opset 17, IR 8, with a symbolic batch dimension; its initializers are the safetensors file's
tensors, by name and value (fp16 and bf16 rounded to nearest even); ONNX Runtime computes loom's
outputs at batch 1 and 7 within 1e-5 relative (fp32, the external-data file, the Softmax ending)
and within 1e-3 for the fp16 export, in both the 2-norm and the max norm of the output. Prints the measured errors. Exit status 1 on any failure.

usage: check_onnx.py DIR [CASE...]   (default: every case of cases.hpp)
"""
import sys

try:
    import numpy as np
    import onnx
    import onnx.numpy_helper
    import onnxruntime as ort
    import safetensors.numpy
    import ml_dtypes
    from common import finish
except ImportError as e:
    sys.exit(f"check_onnx.py: {e}: the io tests' Python environment is incomplete; run `bash scripts/setup`")

CASES = ["linear", "conv2d", "relu", "leaky_relu", "tanh", "sigmoid", "gelu", "max_pool2d", "avg_pool2d",
         "flatten", "layer_norm", "dropout", "residual", "mlp", "cnn", "res_ln"]


def errors(actual, expected):
    """The relative errors of a whole output: in the 2-norm, ||a - e|| / ||e||, and in the max norm,
    max |a - e| / max |e|. Element by element, a value that is a difference of large terms (a
    logit near 0) shows the terms' rounding, not the result's; these do not."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf"), float("inf")
    scale2, scale_max = float(np.linalg.norm(e)), float(np.max(np.abs(e)))
    if scale2 == 0:
        return (0.0, 0.0) if np.array_equal(a, e) else (float("inf"), float("inf"))
    return float(np.linalg.norm(a - e)) / scale2, float(np.max(np.abs(a - e))) / scale_max


def softmax(y):
    """Over axis 1, as the export's Softmax(axis=1)."""
    y = y.astype(np.float64)
    e = np.exp(y - y.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"  FAILED: {what}")


def run(path, x):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(["output"], {"input": x})[0]


def main(d, *cases):
    worst = {}
    for case in cases or CASES:
        base = f"{d}/{case}"
        weights = safetensors.numpy.load_file(f"{base}.safetensors")
        io = safetensors.numpy.load_file(f"{base}.io.safetensors")
        line = []
        for kind in ["", ".fp16", ".bf16", ".softmax", ".external"]:
            path = f"{base}{kind}.onnx"
            try:
                onnx.checker.check_model(path, full_check=True)
            except Exception as e:  # the checker's own error types vary by version
                check(False, f"{path}: onnx.checker: {e}")
            m = onnx.load(path)  # loads external data too
            check(m.ir_version == 8, f"{path}: IR version {m.ir_version}, expected 8")
            check([(o.domain, o.version) for o in m.opset_import] == [("", 17)], f"{path}: opsets {m.opset_import}")
            dims = m.graph.input[0].type.tensor_type.shape.dim
            check(dims[0].dim_param == "batch" and [x.dim_value for x in dims[1:]] == list(io["x1"].shape[1:]),
                  f"{path}: input dims {dims}")
            inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
            check(set(inits) == set(weights), f"{path}: initializers {sorted(inits)} vs safetensors {sorted(weights)}")
            for name, w in weights.items():
                if name not in inits:
                    continue
                got = inits[name]
                if kind == ".fp16":
                    want = w.astype(np.float16)
                elif kind == ".bf16":
                    want = w.astype(ml_dtypes.bfloat16)
                else:
                    want = w
                check(got.dtype == want.dtype and got.shape == want.shape and
                      np.array_equal(got.view(np.uint8), want.view(np.uint8)),
                      f"{path}: initializer {name} differs from the safetensors tensor ({got.dtype} {got.shape})")
            if kind == ".bf16":
                continue  # ONNX Runtime's CPU provider has no bf16 kernels for these operators
            for b in ["1", "7"]:
                y = run(path, io["x" + b])
                want = softmax(io["y" + b]) if kind == ".softmax" else io["y" + b]
                e2, emax = errors(y, want)
                limit = 1e-3 if kind == ".fp16" else 1e-5
                key = (kind or ".fp32")[1:] + f" b{b}"
                worst[key] = max(worst.get(key, (0.0, 0.0)), (e2, emax), key=lambda t: max(t))
                line.append(f"{key} {e2:.1e}/{emax:.1e}")
                check(e2 <= limit and emax <= limit,
                      f"{path}: batch {b}: ONNX Runtime vs loom relative error {e2:.3g} (2-norm), {emax:.3g} (max) > {limit}")
        print(f"{case:12s} " + ", ".join(line))
    print("worst relative errors (2-norm/max): " + ", ".join(f"{k} {v[0]:.1e}/{v[1]:.1e}" for k, v in sorted(worst.items())))
    return finish("check_onnx.py", len(failures), "every export passed")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
