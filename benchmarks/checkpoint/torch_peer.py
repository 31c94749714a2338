# SPDX-License-Identifier: Apache-2.0
"""PyTorch's peer for bench_checkpoint's save / load rows: torch.save of a checkpoint of the same
tensors (the model's state dict and SGD's momentum buffers, as a PyTorch user saves
{"model": ..., "optimizer": ...}) into one file, flushed and fsynced, and torch.load of it, in
paired rounds against the same raw write() + fsync (and read) of the same number of bytes from
this process. Prints a `cpu:` line and one `torch_save:` line per model.

  /usr/bin/python3 torch_peer.py --model mlp,cnn,big [--repeats 5] [--big-repeats 3] [--dir DIR]
"""
import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time

import torch

# The shapes of loom's tensors for the same networks (torch.nn.Sequential's order and names).
SHAPES = {
    "mlp": [(256, 784), (256,), (128, 256), (128,), (10, 128), (10,)],
    "cnn": [(32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 3136), (128,), (10, 128), (10,)],
    "big": [(4096, 4096), (4096,)] * 6 + [(10, 4096), (10,)],
}


def cpu_line():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: impl=torch {model}; torch {torch.__version__}; python {platform.python_version()}"


def fsynced_save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def raw_write(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view[: 1 << 30])
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path, into):
    with open(path, "rb", buffering=0) as f:
        f.readinto(into)


def drop_cached(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(f, *a):
    t0 = time.perf_counter()
    r = f(*a)
    return time.perf_counter() - t0, r


def one_model(name, repeats, root):
    torch.manual_seed(1)
    weights = [torch.randn(s) for s in SHAPES[name]]
    model = {f"{i}.{'weight' if len(s) > 1 else 'bias'}": w for i, (s, w) in enumerate(zip(SHAPES[name], weights))}
    optim = {"state": {i: {"momentum_buffer": torch.randn(w.shape)} for i, w in enumerate(weights)},
             "param_groups": [{"lr": 0.02, "momentum": 0.9, "params": list(range(len(weights)))}]}
    ckpt = {"model": model, "optimizer": optim, "step": 0}
    params = sum(w.numel() for w in weights)
    save_s, raw_w_s, load_s, raw_r_s, load_cold_s, raw_cold_s = [], [], [], [], [], []
    data = back = None
    nbytes = 0
    for i in range(repeats):
        path, raw = os.path.join(root, f"{name}-{i}.pt"), os.path.join(root, f"{name}-{i}.bin")

        def torch_side():
            nonlocal data, back, nbytes
            save_s.append(timed(fsynced_save, ckpt, path)[0])
            if data is None:
                nbytes = os.path.getsize(path)
                data = os.urandom(nbytes)
                back = bytearray(nbytes)
            load_s.append(timed(torch.load, path)[0])

        def raw_side():
            raw_w_s.append(timed(raw_write, raw, data)[0])
            raw_r_s.append(timed(raw_read, raw, back)[0])

        def torch_cold():
            drop_cached(path)
            load_cold_s.append(timed(torch.load, path)[0])

        def raw_cold():
            drop_cached(raw)
            raw_cold_s.append(timed(raw_read, raw, back)[0])

        order = [torch_side, raw_side, torch_cold, raw_cold] if i % 2 == 0 else [raw_side, torch_side, raw_cold, torch_cold]
        for f in order:
            f()
        os.remove(path)
        os.remove(raw)
    med = statistics.median
    ratio = med(r / s for r, s in zip(raw_w_s, save_s))
    print(f"torch_save: model={name} parameters={params} bytes={nbytes} repeats={repeats} save_s={med(save_s):.4f} "
          f"save_mb_s={nbytes / med(save_s) / 1e6:.0f} raw_write_s={med(raw_w_s):.4f} "
          f"raw_write_mb_s={nbytes / med(raw_w_s) / 1e6:.0f} ratio={ratio:.3f} "
          f"warm_s={med(load_s):.4f} warm_mb_s={nbytes / med(load_s) / 1e6:.0f} raw_warm_s={med(raw_r_s):.4f} "
          f"warm_ratio={med(r / s for r, s in zip(raw_r_s, load_s)):.3f} "
          f"cold_s={med(load_cold_s):.4f} cold_mb_s={nbytes / med(load_cold_s) / 1e6:.0f} raw_cold_s={med(raw_cold_s):.4f} "
          f"cold_ratio={med(r / s for r, s in zip(raw_cold_s, load_cold_s)):.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp,cnn,big")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big-repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(cpu_line(), flush=True)
    root = tempfile.mkdtemp(prefix="loom_bench_checkpoint_torch_", dir=a.dir)
    try:
        for m in a.model.split(","):
            one_model(m, a.big_repeats if m == "big" else a.repeats, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
