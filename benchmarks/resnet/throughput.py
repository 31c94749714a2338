# SPDX-License-Identifier: Apache-2.0
"""The PyTorch side of bench_resnet_throughput (benchmarks/resnet/throughput.cpp): the same
networks, optimizer, batch and thread counts, on seeded random images preloaded as tensors (no
DataLoader), in eager mode or under torch.compile.

  python throughput.py [--impl eager|compile] [--model resnet20,resnet18] [--threads 1,2]
                       [--math fp32,bf16] [--batch 64] [--samples 1024] [--seconds 3]
                       [--warmup 1] [--repeats 1] [--seed 1]

resnet20: the CIFAR ResNet-20 (He et al., option B shortcuts) exactly as
tests/models/check_cifar_sgd.py defines it, with 1 input channel, on 1 x 28 x 28 images;
resnet18: torchvision.models.resnet18(num_classes=10) on 3 x 64 x 64 images. SGD with lr 0.02
and momentum 0.9, softmax cross-entropy. --math bf16 runs the forward pass under CPU autocast to
bfloat16 (parameters, gradients and the optimizer stay float32), PyTorch's counterpart of loom's
math_mode::bf16. Each row: for compile, first the compile warm-up (the first steps, which
compile the forward and backward graphs; not counted), then warm-up steps for --warmup seconds,
then --repeats timed runs of a fixed number of steps (sized to last about --seconds), and the
median. Prints `versions: torch=... torchvision=...` first, then one
`row: impl=torch_eager|torch_compile model=M batch=B threads=T math=fp32|bf16 samples_per_s=S ...`
line per row, in the format of the C++ side. Run it with the venv of
benchmarks/data/make_venv.sh (current PyTorch and torchvision from PyPI).
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models"))
from check_cifar_sgd import CifarResNet  # noqa: E402  the twin of loom::models::resnet_cifar<20>

SHAPES = {"resnet20": (1, 28, 28), "resnet18": (3, 64, 64)}


def make_model(name):
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10)
    net = CifarResNet(depth=20, classes=10)
    net.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)  # one input channel, as loom's input<1, 28, 28>
    return net


def random_images(name, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *SHAPES[name]), generator=g, dtype=torch.uint8).float() / 255.0
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def measure(args, name, threads, math):
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    x, y = random_images(name, args.samples, args.seed)
    model = make_model(name).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    net = torch.compile(model) if args.impl == "compile" else model
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if math == "bf16" else contextlib.nullcontext
    batches_per_epoch = args.samples // args.batch
    state = {"perm": None, "i": batches_per_epoch, "loss": 0.0}

    def step():
        if state["i"] == batches_per_epoch:  # a new epoch: reshuffle (the last partial batch is dropped)
            state["perm"], state["i"] = torch.randperm(args.samples), 0
        idx = state["perm"][state["i"] * args.batch:(state["i"] + 1) * args.batch]
        state["i"] += 1
        xb, yb = x[idx], y[idx]
        with cast():
            loss = F.cross_entropy(net(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def run_steps(n):
        t0 = time.perf_counter()
        for _ in range(n):
            loss = step()
        state["loss"] = float(loss.detach())
        return n * args.batch / (time.perf_counter() - t0)

    compile_s = 0.0
    if args.impl == "compile":  # the compile warm-up: the first steps compile forward and backward
        t0 = time.perf_counter()
        run_steps(2)
        compile_s = time.perf_counter() - t0
    rate, chunk, chunks, w0 = 0.0, 1, 0, time.perf_counter()
    while chunks < 2 or time.perf_counter() - w0 < args.warmup:
        rate = run_steps(chunk)
        chunk, chunks = min(chunk * 2, 64), chunks + 1
    steps = max(2, round(args.seconds * rate / args.batch))
    runs = [run_steps(steps) for _ in range(args.repeats)]
    return statistics.median(runs), runs, steps, state["loss"], compile_s


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=["eager", "compile"], default="eager")
    p.add_argument("--model", default="resnet20,resnet18")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--math", default="fp32,bf16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    models, maths = args.model.split(","), args.math.split(",")
    for m in models:
        if m not in SHAPES:
            p.error(f"--model takes resnet20 and/or resnet18, got {m!r}")
    for m in maths:
        if m not in ("fp32", "bf16"):
            p.error(f"--math takes fp32 and/or bf16, got {m!r}")
    if args.samples < args.batch:
        p.error("--samples must be at least --batch")
    print(f"versions: torch={torch.__version__} torchvision={torchvision.__version__}", flush=True)
    for name in models:
        for threads in (int(t) for t in args.threads.split(",")):
            for math in maths:
                med, runs, steps, loss, compile_s = measure(args, name, threads, math)
                print(f"row: impl=torch_{args.impl} model={name} batch={args.batch} threads={threads} math={math} "
                      f"samples_per_s={med:.1f} runs={','.join(str(round(r)) for r in runs)} steps={steps} "
                      f"train_loss={loss:.4f} compile_s={compile_s:.1f}", flush=True)


if __name__ == "__main__":
    main()
