#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch peer of bench_train_throughput: the same networks, initialisation, optimizer,
batches and thread counts, on the real Fashion-MNIST preloaded as tensors (no DataLoader).

Throughput mode (default): for each (model, batch, threads, math) row, a warm-up, then --repeats
timed runs of a fixed number of steps (sized to last about --seconds), and the median; one
`row: impl=torch ...` line per row, in the same format as the C++ side. --math bf16 runs the
forward pass under CPU autocast to bfloat16 (torch.autocast("cpu", dtype=torch.bfloat16):
linear and convolution in bf16, parameters, gradients and the optimizer in float32), PyTorch's
counterpart of loom's trainer_options::math = math_mode::bf16.

Accuracy mode (--accuracy): full epochs of training (shuffled each epoch, last partial batch
included), then the test accuracy, printed as one `result: impl=torch ...` line.

Run it with Debian's python3-torch (/usr/bin/python3). Whether PyTorch runs "as installed" or
"tuned" is decided by the caller's environment (OPENBLAS_CORETYPE, OPENBLAS_NUM_THREADS) and by
--flush-denormal; run.sh sets both and the row line reports what was in effect. The first line
on stdout, `cpu: impl=torch variant=... ...` (cpu_line()), names the CPU as this torch sees it.
"""

import argparse
import ctypes
import gzip
import math
import os
import re
import resource
import statistics
import struct
import sys
import time

import numpy as np
import torch
from torch import nn

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (raw or gzip'd) as a numpy array of its dimensions."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{stem}[.gz] not found in {data_dir}")


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(find(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(data_dir, f"{prefix}-labels-idx1-ubyte"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28).contiguous()
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_model(name):
    """The networks of examples/fashion_mnist, initialised as loom does: Kaiming (He) normal
    with fan_in for ReLU (std sqrt(2 / fan_in), conv fan_in = C * K * K), zero biases."""
    if name == "mlp":
        net = nn.Sequential(nn.Flatten(),
                            nn.Linear(784, 256), nn.ReLU(),
                            nn.Linear(256, 128), nn.ReLU(),
                            nn.Linear(128, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Flatten(),
                            nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                            nn.Linear(128, 10))
    for m in net.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return net


# FLOP of one training step per sample (matrix products and convolutions only, as in main.cpp).
FLOPS = {"mlp": 1.007104e6, "cnn": 24.995328e6}


def cpu_snapshot():
    """(wall, CPU seconds of all processes from /proc/stat, CPU seconds of this process)."""
    with open("/proc/stat") as f:
        v = [float(x) for x in f.readline().split()[1:9]]
    busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), busy, ru.ru_utime + ru.ru_stime


def others_cores(a, b):
    """Cores other processes kept busy between snapshots a and b."""
    wall = b[0] - a[0]
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall) if wall > 0 else 0.0


def blas_info():
    """Which BLAS torch loaded, and for OpenBLAS the kernel core it picked and its threads."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if "blas" in os.path.basename(p):
                libs.add(p)
    core, nthreads, name = "-", "-", "other"
    if any("/blas/libblas" in p for p in libs):
        name = "reference"
    for p in sorted(libs):
        if "openblas" in os.path.basename(p):
            try:
                ob = ctypes.CDLL(p, mode=os.RTLD_NOLOAD)
                ob.openblas_get_corename.restype = ctypes.c_char_p
                core = ob.openblas_get_corename().decode()
                nthreads = str(ob.openblas_get_num_threads())
                name = "openblas"
            except (OSError, AttributeError):
                pass
    return name, core, nthreads, sorted(libs)


# oneDNN's dnnl_cpu_isa_t values (oneDNN 2.x, the libdnnl.so.2 Debian's torch uses) and names.
ONEDNN_ISA = {0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0x407: "avx2_vnni", 0xf: "avx512_mic",
              0x1f: "avx512_mic_4ops", 0x27: "avx512_core", 0x67: "avx512_core_vnni",
              0xe7: "avx512_core_bf16", 0x3e7: "avx512_core_amx"}


def cpu_line():
    """The CPU as this torch sees it, in the words of loom's cpu_features::str(): model; vector
    ISA (from /proc/cpuinfo); the ISA ATen's vectorised kernels use; the ISA oneDNN (torch's
    convolutions, and its bf16 products) dispatches to, after ONEDNN_MAX_CPU_ISA; bf16 math (oneDNN
    2.x has bf16 primitives from avx512_core up); the OpenBLAS core (torch's fp32 GEMMs)."""
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
    avx2 = {"avx2", "fma"} <= flags
    isa = "AVX-512" if avx512 else "AVX2, no AVX-512" if avx2 else "no AVX2"
    if avx512:
        isa += " with avx512_bf16" if "avx512_bf16" in flags else ", no avx512_bf16"
    if avx2:
        isa += ", AMX (amx_bf16)" if {"amx_tile", "amx_bf16"} <= flags else ", no AMX"
    found = re.search(r"CPU capability usage: (\S+)", torch.__config__.show())
    onednn, bf16 = "?", "?"
    try:
        code = ctypes.CDLL("libdnnl.so.2").dnnl_get_effective_cpu_isa()
        onednn = ONEDNN_ISA.get(code, f"isa 0x{code:x}")
        bf16 = "yes" if onednn.startswith("avx512_core") else "no"
    except (OSError, AttributeError):
        pass
    limit = next((f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA") if os.environ.get(k)), "")
    _, core, _, _ = blas_info()
    return (f"{model}; {isa}; ATen {found.group(1) if found else '?'}; oneDNN {onednn}"
            f"{f' (limited by {limit})' if limit else ''}; bf16 math {bf16}; OpenBLAS {core}")


class Trainer:
    def __init__(self, model_name, seed, math="fp32"):
        torch.manual_seed(seed)
        self.net = make_model(model_name)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.02, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()
        self.bf16 = math == "bf16"

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            out = self.net(x)
        loss = self.loss(out.float(), y)
        loss.backward()
        self.opt.step()
        return loss


def env_label():
    keys = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS")
    s = ",".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ)
    return s or "none"


def measure(args, model_name, x, y, batch, threads, math):
    torch.set_num_threads(threads)
    t = Trainer(model_name, args.seed, math)
    t.net.train()
    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(x.shape[0], generator=g)
    n = x.shape[0]
    state = {"loss": float("nan")}

    def run_steps(steps):
        # Same as loom's fit(): each call starts over at the permutation's beginning and
        # gathers every batch from the preloaded tensors.
        pos, samples = 0, 0
        t0 = time.perf_counter()
        for _ in range(steps):
            if pos >= n:
                pos = 0
            idx = perm[pos:pos + batch]
            pos += batch
            loss = t.step(x.index_select(0, idx), y.index_select(0, idx))
            samples += idx.shape[0]
        state["loss"] = loss.item()
        return samples / (time.perf_counter() - t0)

    # Warm-up as in main.cpp: at least two chunks and args.warmup seconds; the last chunk's rate
    # sizes the timed repeats.
    rate, chunk, chunks = 0.0, 4, 0
    w0 = time.perf_counter()
    while chunks < 2 or time.perf_counter() - w0 < args.warmup:
        rate = run_steps(chunk)
        chunk = min(chunk * 2, 256)
        chunks += 1
    steps = max(5, round(args.seconds * rate / batch))
    c0 = cpu_snapshot()
    runs = [run_steps(steps) for _ in range(args.repeats)]
    return statistics.median(runs), runs, steps, state["loss"], others_cores(c0, cpu_snapshot())


def throughput(args):
    x, y = load(args.data, "train")
    blas, core, blas_threads, _ = blas_info()
    for model_name in args.models:
        xm = x.reshape(-1, 784) if model_name == "mlp" else x
        for batch in args.batches:
            for threads, math_mode in [(t, m) for t in args.threads for m in args.maths]:
                med, runs, steps, loss, others = measure(args, model_name, xm, y, batch, threads, math_mode)
                gflops = med * FLOPS[model_name] / 1e9
                _, core, blas_threads, _ = blas_info()
                print(f"row: impl=torch variant={args.variant} model={model_name} batch={batch} threads={threads} "
                      f"math={math_mode} "
                      f"samples_per_s={med:.0f} runs={','.join(str(round(r)) for r in runs)} steps={steps} "
                      f"mflop_per_sample={FLOPS[model_name] / 1e6:.3f} gflops={gflops:.2f} "
                      f"nominal_fraction={gflops / (160.0 * threads):.3f} train_loss={loss:.4f} others_cores={others:.2f} "
                      f"blas={blas} blas_core={core} blas_threads={blas_threads} "
                      f"flush_denormal={int(args.flush_denormal)} env={env_label()}", flush=True)
                if not math.isfinite(loss):
                    print("torch_peer: training diverged", file=sys.stderr)
                    return 1
    return 0


def accuracy(args):
    torch.set_num_threads(args.threads[0])
    x, y = load(args.data, "train")
    xt, yt = load(args.data, "test")
    model_name = args.models[0]
    if model_name == "mlp":
        x, xt = x.reshape(-1, 784), xt.reshape(-1, 784)
    t = Trainer(model_name, args.seed, args.maths[0])
    g = torch.Generator().manual_seed(args.seed)
    batch, n = args.batches[0], x.shape[0]
    seconds, samples, loss_sum, seen = 0.0, 0, 0.0, 0
    for epoch in range(args.epochs):
        t.net.train()
        perm = torch.randperm(n, generator=g)
        loss_sum, seen = 0.0, 0
        t0 = time.perf_counter()
        for pos in range(0, n, batch):
            idx = perm[pos:pos + batch]
            loss = t.step(x.index_select(0, idx), y.index_select(0, idx))
            loss_sum += loss.item() * idx.shape[0]
            seen += idx.shape[0]
        seconds += time.perf_counter() - t0
        samples += seen
        if not args.quiet:
            print(f"torch_peer: {model_name} epoch {epoch + 1}/{args.epochs} loss {loss_sum / seen:.4f}",
                  file=sys.stderr, flush=True)
    t.net.eval()
    correct = 0
    with torch.no_grad():
        for pos in range(0, xt.shape[0], 500):
            correct += (t.net(xt[pos:pos + 500]).argmax(1) == yt[pos:pos + 500]).sum().item()
    print(f"result: impl=torch model={model_name} epochs={args.epochs} batch={batch} "
          f"test_accuracy={correct / xt.shape[0]:.4f} train_loss={loss_sum / seen:.4f} "
          f"samples_per_s={samples / seconds:.0f} threads={args.threads[0]} variant={args.variant} "
          f"env={env_label()}", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp,cnn", help="models, comma-separated: mlp,cnn")
    p.add_argument("--batch", default="64,256", help="batch sizes, comma-separated")
    p.add_argument("--threads", default="1,2", help="thread counts (torch.set_num_threads), comma-separated")
    p.add_argument("--math", default="fp32", help="fp32 and/or bf16 (CPU autocast), comma-separated")
    p.add_argument("--seconds", type=float, default=2.0, help="length of one timed repeat")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up steps per row")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per row (median reported)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True)")
    p.add_argument("--variant", default="-", help="label printed in each line (installed / tuned)")
    p.add_argument("--data", default=DATA_DIR)
    p.add_argument("--accuracy", action="store_true", help="train full epochs and print the test accuracy")
    p.add_argument("--epochs", type=int, default=5, help="epochs in --accuracy mode")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    args.models = [m for m in args.model.split(",") if m]
    if not args.models or any(m not in ("mlp", "cnn") for m in args.models):
        p.error("--model takes mlp and/or cnn")
    args.batches = [int(b) for b in args.batch.split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    args.maths = [m for m in args.math.split(",") if m]
    if not args.maths or any(m not in ("fp32", "bf16") for m in args.maths):
        p.error("--math takes fp32 and/or bf16")
    if args.flush_denormal and not torch.set_flush_denormal(True):
        print("torch_peer: set_flush_denormal is not supported on this CPU", file=sys.stderr)
    blas, core, blas_threads, libs = blas_info()
    print(f"torch_peer: torch {torch.__version__}, blas {blas} (core {core}, {blas_threads} threads) "
          f"from {' '.join(libs) or '?'}; env {env_label()}", file=sys.stderr)
    print(f"cpu: impl=torch variant={args.variant} {cpu_line()}", flush=True)
    if blas == "reference":
        print("torch_peer: warning: torch runs on the netlib reference BLAS (libblas3), not OpenBLAS; "
              "apt-get install libopenblas0-pthread (libtorch1.13 recommends libopenblas0)", file=sys.stderr)
    return accuracy(args) if args.accuracy else throughput(args)


if __name__ == "__main__":
    sys.exit(main())
