#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch peer of bench_data_parallel: DistributedDataParallel (gloo, 127.0.0.1) over
--procs processes started with torch.multiprocessing, each on torch.set_num_threads(--threads),
training the networks of examples/fashion_mnist on the real Fashion-MNIST preloaded as tensors
(no DataLoader): the same initialisation (Kaiming normal fan_in, zero biases), SGD lr 0.02
momentum 0.9, the same global batch, each process taking its contiguous share of every global
batch of one shuffled order (as loom's distributed sampler does), DDP averaging the gradients.

For each (model, global batch) row: a warm-up, then --repeats timed runs of a fixed number of
steps (sized from the warm-up to last about --seconds; every decision taken on rank 0 and
broadcast), and the median; rank 0 prints one `row: impl=torch-ddp ...` line per row, samples
per second of all processes together on the slowest process's clock.

The data loading, the networks and the BLAS report come from
benchmarks/train_throughput/torch_peer.py. Tuning (OPENBLAS_CORETYPE, OPENBLAS_NUM_THREADS) is
the caller's environment, which the processes inherit; --flush-denormal sets
torch.set_flush_denormal(True) in each. Run with Debian's python3-torch (/usr/bin/python3).
"""

import argparse
import importlib.util
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "..", "train_throughput", "torch_peer.py")


def peer_module():
    spec = importlib.util.spec_from_file_location("torch_peer", PEER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def machine_busy():
    """(wall, CPU seconds of all processes from /proc/stat, CPU seconds of this process)."""
    with open("/proc/stat") as f:
        v = [float(x) for x in f.readline().split()[1:9]]
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK"), ru.ru_utime + ru.ru_stime


def env_label():
    keys = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    return ",".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ) or "none"


def measure(args, peer, rank, world, model_name, x, y, batch):
    torch.manual_seed(args.seed)
    net = peer.make_model(model_name)  # the same on every process; DDP also broadcasts rank 0's
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ddp.train()
    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(x.shape[0], generator=g)
    n = x.shape[0]
    lo, hi = batch * rank // world, batch * (rank + 1) // world  # this process's share
    state = {"loss": float("nan")}

    def run_steps(steps):
        # Each call starts over at the permutation's beginning, as loom's fit() does.
        pos = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            if pos + batch > n:
                pos = 0
            idx = perm[pos + lo:pos + hi]
            pos += batch
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x.index_select(0, idx)), y.index_select(0, idx))
            loss.backward()
            opt.step()
        state["loss"] = loss.item()
        return time.perf_counter() - t0

    def from_rank0(value, dtype=torch.float64):
        t = torch.tensor([value], dtype=dtype)
        dist.broadcast(t, 0)
        return t.item()

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rate, chunk, chunks = 0.0, 4, 0
    w0 = time.perf_counter()
    while from_rank0(int(chunks < 2 or time.perf_counter() - w0 < args.warmup), torch.int64):
        rate = chunk * batch / slowest(run_steps(chunk))
        chunk = min(chunk * 2, 256)
        chunks += 1
    steps = int(from_rank0(max(5, round(args.seconds * rate / batch)), torch.int64))
    dist.barrier()
    c0 = machine_busy()
    runs = []
    for _ in range(args.repeats):
        dist.barrier()
        runs.append(steps * batch / slowest(run_steps(steps)))
    c1 = machine_busy()
    own = torch.tensor([c1[2] - c0[2]], dtype=torch.float64)
    dist.all_reduce(own)  # every process's CPU time, its gloo threads included
    wall = c1[0] - c0[0]
    others = max(0.0, ((c1[1] - c0[1]) - own.item()) / wall) if wall > 0 else 0.0
    return statistics.median(runs), runs, steps, state["loss"], others


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True) and rank == 0:
        print("torch_ddp: set_flush_denormal is not supported on this CPU", file=sys.stderr)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    peer = peer_module()
    x, y = peer.load(args.data, "train")
    blas, core, blas_threads, _ = peer.blas_info()
    if rank == 0:
        print(f"torch_ddp: torch {torch.__version__}, {args.procs} process(es) x {args.threads} thread(s), "
              f"gloo on 127.0.0.1:{port}, blas {blas} (core {core}, {blas_threads} threads); env {env_label()}",
              file=sys.stderr, flush=True)
        print(f"cpu: impl=torch-ddp {peer.cpu_line()}", flush=True)
    for model_name in args.models:
        xm = x.reshape(-1, 784) if model_name == "mlp" else x
        for batch in args.batches:
            med, runs, steps, loss, others = measure(args, peer, rank, args.procs, model_name, xm, y, batch)
            _, core, blas_threads, _ = peer.blas_info()
            if rank == 0:
                print(f"row: impl=torch-ddp model={model_name} batch={batch} procs={args.procs} threads={args.threads} "
                      f"samples_per_s={med:.0f} runs={','.join(str(round(r)) for r in runs)} steps={steps} "
                      f"train_loss={loss:.4f} others_cores={others:.2f} blas={blas} blas_core={core} "
                      f"blas_threads={blas_threads} flush_denormal={int(args.flush_denormal)} backend=gloo "
                      f"env={env_label()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp,cnn", help="models, comma-separated: mlp,cnn")
    p.add_argument("--batch", default="64,128", help="global batch sizes, comma-separated")
    p.add_argument("--procs", type=int, default=2, help="processes (DDP world size)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each process")
    p.add_argument("--seconds", type=float, default=2.0, help="length of one timed repeat")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up per row")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per row (median reported)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    args.models = [m for m in args.model.split(",") if m]
    if not args.models or any(m not in ("mlp", "cnn") for m in args.models):
        p.error("--model takes mlp and/or cnn")
    args.batches = [int(b) for b in args.batch.split(",")]
    if any(b < args.procs for b in args.batches):
        p.error("every global batch needs at least one sample per process")
    if not dist.is_available() or not dist.is_gloo_available():
        print("torch_ddp: this torch has no torch.distributed with gloo", file=sys.stderr)
        return 1
    mp.spawn(worker, args=(args, free_port()), nprocs=args.procs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
