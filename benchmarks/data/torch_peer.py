#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's side of the data benchmark (benchmarks/data/run.sh): the same work as bench_data.

    torch_peer.py --dir DIR --variant pil|tv [--what jpeg|png] [--mode one|pool] [--threads N]
                  [--seconds S] [--repeats R]

jpeg: RandomResizedCrop(224), RandomHorizontalFlip(), to float / 255, Normalize(ImageNet).
  pil: PIL's decode (Image.open(...).convert("RGB")) and torchvision.transforms (v1, on PIL
       images: ToTensor);
  tv:  torchvision.io.decode_jpeg and torchvision.transforms.v2 on uint8 tensors
       (RandomResizedCrop with antialias, ToDtype(float32, scale=True)).
png: Fashion-MNIST's 28 x 28 grey PNGs to float / 255.
  pil: Image.open(...) then ToTensor; tv: torchvision.io.decode_png(mode GRAY), ToDtype(scale=True).
mode one: one process, one thread, sample after sample. mode pool: torch.utils.data.DataLoader
with N worker processes, batch 64, shuffled, collation and the workers' IPC included.
Prints `row:` lines like bench_data's, a `cpu:` line and the versions.
"""
import argparse
import glob
import io
import os
import re
import statistics
import sys
import time

import torch


def cpu_line():
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
    isa = "AVX-512" if avx512 else "AVX2, no AVX-512" if {"avx2", "fma"} <= flags else "no AVX2"
    found = re.search(r"CPU capability usage: (\S+)", torch.__config__.show())
    return f"{model}; {isa}; ATen {found.group(1) if found else '?'}"


def make_transform(variant, what):
    if what == "jpeg":
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
        if variant == "pil":
            import torchvision.transforms as T
            from PIL import Image
            t = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
            return lambda b: t(Image.open(io.BytesIO(b)).convert("RGB"))
        import torchvision.transforms.v2 as v2
        from torchvision.io import decode_jpeg
        t = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                        v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
        return lambda b: t(decode_jpeg(torch.frombuffer(b, dtype=torch.uint8)))
    if variant == "pil":
        import torchvision.transforms as T
        from PIL import Image
        t = T.ToTensor()
        return lambda b: t(Image.open(io.BytesIO(b)))
    import torchvision.transforms.v2 as v2
    from torchvision.io import ImageReadMode, decode_png
    t = v2.ToDtype(torch.float32, scale=True)
    return lambda b: t(decode_png(torch.frombuffer(b, dtype=torch.uint8), mode=ImageReadMode.GRAY))


class Encoded(torch.utils.data.Dataset):
    """The files' bytes in memory, decoded and transformed on access."""

    def __init__(self, files, variant, what):
        # Made (and torchvision imported) here, before the workers fork: they start warm.
        self.files, self.transform = files, make_transform(variant, what)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.transform(self.files[i]), 0


def one_thread(files, variant, what, seconds):
    t = make_transform(variant, what)
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(64):
            t(files[n % len(files)])
            n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return n / elapsed


def end_to_end(files, variant, what, threads, seconds):
    loader = torch.utils.data.DataLoader(Encoded(files, variant, what), batch_size=64, shuffle=True,
                                         num_workers=threads, persistent_workers=True, prefetch_factor=2)
    it = iter(loader)

    def batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    for _ in range(2 * threads):  # warm-up: every worker has started and delivered
        batch()
    images, t0 = 0, time.perf_counter()
    while True:
        x, _ = batch()
        float(x[:, 0, 0, 0].sum())
        images += x.shape[0]
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            del it, loader
            return images / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--variant", choices=["pil", "tv"], required=True)
    ap.add_argument("--what", choices=["jpeg", "png"], default="jpeg")
    ap.add_argument("--mode", choices=["one", "pool"], default="one")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ext = ".jpg" if a.what == "jpeg" else ".png"
    files = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(a.dir, "*" + ext)))]
    if not files:
        sys.exit(f"torch_peer.py: no {ext} files in {a.dir}")
    if a.variant == "tv":
        files = [bytearray(b) for b in files]  # torch.frombuffer wants a writable buffer
    import PIL
    import torchvision
    from PIL import features
    print(f"cpu: impl=torch variant={a.variant} {cpu_line()}")
    print(f"versions: impl=torch torch={torch.__version__} torchvision={torchvision.__version__} "
          f"pillow={PIL.__version__} pillow_libjpeg_turbo={features.version('libjpeg_turbo')} python={sys.version.split()[0]}")
    sys.stdout.flush()
    threads = 1 if a.mode == "one" else a.threads
    rates = []
    for _ in range(a.repeats):
        if a.mode == "one":
            rates.append(one_thread(files, a.variant, a.what, a.seconds))
        else:
            rates.append(end_to_end(files, a.variant, a.what, a.threads, a.seconds))
    m = statistics.median(rates)
    print(f"row: impl=torch variant={a.variant} what={a.what} mode={a.mode} threads={threads} images_per_s={m:.1f} "
          f"per_core={m / threads:.1f} repeats={a.repeats}")


if __name__ == "__main__":
    main()
