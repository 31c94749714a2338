#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch peer of gpu_check's training throughput: the main example's mlp and cnn, SGD
(lr 0.02, momentum 0.9), softmax cross-entropy, random 28x28 images, on the same GPU.

As loom's trainer does, every step converts a batch of byte images on the host to floats in
[0, 1], copies it to the GPU (pinned memory, non-blocking) and reads the loss back. TF32 is off
(loom::cuda computes in FP32). Prints one line per row: `torch MODEL BATCH SAMPLES_PER_S`.
Exit code 3 when PyTorch or a CUDA device is missing (the caller prints that and goes on).
"""

import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per row")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batches", default="64,256")
    args = ap.parse_args()
    try:
        import torch
        from torch import nn
    except ImportError as e:
        print(f"torch_peer: PyTorch is not installed ({e})", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("torch_peer: PyTorch sees no CUDA device", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(1)
    n = 16384
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (n,), dtype=torch.int64)
    print(f"torch_peer: PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}, "
          f"cuDNN {torch.backends.cudnn.version()}", file=sys.stderr)

    def make(model):
        if model == "mlp":
            return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                 nn.Linear(128, 10))
        return nn.Sequential(nn.Conv2d(1, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, 1, 1),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                             nn.Linear(128, 10))

    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            net = make(model).to(dev)
            opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
            loss_fn = nn.CrossEntropyLoss()
            staging = torch.empty((batch, 1, 28, 28), dtype=torch.float32).pin_memory()
            staged_labels = torch.empty((batch,), dtype=torch.int64).pin_memory()
            order = torch.randperm(n)
            pos = 0

            def step():
                nonlocal pos
                if pos + batch > n:
                    pos = 0
                idx = order[pos:pos + batch]
                pos += batch
                torch.div(images[idx].to(torch.float32), 255.0, out=staging)
                staged_labels.copy_(labels[idx])
                x = staging.to(dev, non_blocking=True)
                y = staged_labels.to(dev, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(net(x), y)
                loss.backward()
                opt.step()
                return loss.item()

            for _ in range(20):
                step()
            torch.cuda.synchronize()
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                step()
                steps += 1
            torch.cuda.synchronize()
            rate = steps * batch / (time.perf_counter() - t0)
            print(f"torch {model} {batch} {rate:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
