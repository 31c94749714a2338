# SPDX-License-Identifier: Apache-2.0
"""The PyTorch twin of the resnet example's accuracy run (benchmarks/resnet/accuracy.sh): the
CIFAR ResNet-20 with one input channel (throughput.py's twin of loom::models::resnet_cifar<20>)
trained on Fashion-MNIST with torch.nn.parallel.DistributedDataParallel over gloo, RANKS processes
of one thread each, from the initial weights loom wrote (--init, safetensors with PyTorch's
names, loaded strict), with the example's recipe: SGD lr 0.02 momentum 0.9, no weight decay, the
global batch split over the ranks (DistributedSampler, reshuffled each epoch from --seed; the
last batch of an epoch short, as loom's), mean softmax cross-entropy, pixel / 255, a constant
learning rate or (--lr-schedule cosine) cosine annealing to 0 over every step of the run, set
before each step as loom::cosine_warmup gives it (CosineAnnealingLR's closed form); then rank 0's
model in eval mode on the 10,000 test images. Prints one line:

    result: impl=torch epochs=E batch=B ranks=R seed=S test_accuracy=A train_loss=L seconds=T

accuracy.py --data DIR --init FILE [--epochs 5] [--batch 64] [--ranks 2] [--seed 1]
            [--lr 0.02] [--momentum 0.9] [--lr-schedule constant|cosine]
accuracy.py --write-init FILE [--seed 1]   PyTorch's initial weights of the twin, drawn from
            torch.manual_seed(seed), as safetensors (what loom's --load-weights reads)
"""

import argparse
import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models"))
import safetensors_io  # noqa: E402
from throughput import make_model  # noqa: E402


def read_idx(path):
    """An IDX file (gzip'd or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_split(d, prefix):
    def find(kind):
        for name in (f"{prefix}-{kind}.gz", f"{prefix}-{kind}"):
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
        raise SystemExit(f"accuracy.py: no {prefix}-{kind}[.gz] in {d}")
    x = torch.from_numpy(read_idx(find("images-idx3-ubyte")).astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(read_idx(find("labels-idx1-ubyte")).astype(np.int64))
    return x, y


def worker(rank, args, port, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    x, y = load_split(args.data, "train")
    tx, ty = load_split(args.data, "t10k")
    torch.manual_seed(args.seed)
    model = make_model("resnet20")
    model.load_state_dict(safetensors_io.load(args.init), strict=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(x, y), num_replicas=args.ranks,
                                                  rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    local = args.batch // args.ranks
    total = math.ceil(len(x) / args.batch) * args.epochs  # the steps of the run (loom's count)
    step = 0
    t0 = time.perf_counter()
    loss_sum = torch.zeros(2)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        ddp.train()
        loss_sum.zero_()
        for k in range(0, len(order), local):
            idx = order[k:k + local]
            if args.lr_schedule == "cosine":
                for g in opt.param_groups:
                    g["lr"] = 0.5 * args.lr * (1 + math.cos(math.pi * step / total))
            step += 1
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            loss_sum += torch.tensor([loss.item() * len(idx), len(idx)])
    seconds = time.perf_counter() - t0
    dist.all_reduce(loss_sum)
    if rank == 0:
        model.eval()
        correct = 0
        with torch.no_grad():
            for k in range(0, len(tx), 500):
                correct += (model(tx[k:k + 500]).argmax(1) == ty[k:k + 500]).sum().item()
        out.put((correct / len(tx), (loss_sum[0] / loss_sum[1]).item(), seconds))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--init")
    p.add_argument("--write-init")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    args = p.parse_args()
    if args.write_init:
        torch.manual_seed(args.seed)
        safetensors_io.save(make_model("resnet20").state_dict(), args.write_init)
        return
    if not args.init:
        raise SystemExit("accuracy.py: --init FILE is needed (write one with --write-init FILE)")
    if args.batch % args.ranks:
        raise SystemExit(f"accuracy.py: --batch {args.batch} does not split over {args.ranks} ranks")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    mp.spawn(worker, args=(args, port, out), nprocs=args.ranks, join=True)
    acc, loss, seconds = out.get()
    print(f"result: impl=torch epochs={args.epochs} batch={args.batch} ranks={args.ranks} seed={args.seed} "
          f"lr_schedule={args.lr_schedule} "
          f"test_accuracy={acc:.4f} train_loss={loss:.4f} seconds={seconds:.1f}", flush=True)


if __name__ == "__main__":
    main()
