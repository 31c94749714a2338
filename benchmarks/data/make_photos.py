#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Makes the data benchmark's images: random 256 x 256 crops of scikit-image's colour photos,
JPEG quality 90 (Pillow, 4:2:0), and Fashion-MNIST's images as 28 x 28 grey PNGs.

    python3 benchmarks/data/make_photos.py OUT_DIR [--count 2000] [--size 256] [--quality 90]
                                           [--seed 1] [--fashion-mnist DIR] [--png-count 10000]

Writes OUT_DIR/jpeg/NNNNN.jpg and OUT_DIR/png/NNNNN.png, and OUT_DIR/README.txt saying how
they were made. The photos are scikit-image's public-domain (CC0) colour samples that ship in
Debian's python3-skimage without a download: the crops are drawn with Python's random module
seeded with --seed, so the same command makes the same files. Needs numpy, Pillow, skimage
(Debian: python3-skimage python3-pil) and, for the PNGs, Fashion-MNIST's IDX files (Debian:
dataset-fashion-mnist).
"""
import argparse
import gzip
import io
import os
import random
import sys

import numpy as np
from PIL import Image

# scikit-image's colour photos (CC0 / public domain) that ship with the package (no download).
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina", "stereo_motorcycle"]


def photos():
    import skimage.data as data
    out = []
    for name in PHOTOS:
        try:
            img = getattr(data, name)()
        except Exception as e:  # a name this version of skimage lacks or must download
            print(f"make_photos.py: skipping skimage.data.{name}: {type(e).__name__}", file=sys.stderr)
            continue
        if isinstance(img, tuple):  # stereo_motorcycle: (left, right, disparity)
            img = img[0]
        if img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8:
            out.append((name, img))
    return out


def read_idx_images(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    n, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    return np.frombuffer(raw, np.uint8, n * rows * cols, 16).reshape(n, rows, cols)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fashion-mnist", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--png-count", type=int, default=10000)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    src = photos()
    if not src:
        sys.exit("make_photos.py: no colour photo found in skimage.data (Debian: python3-skimage)")
    os.makedirs(os.path.join(a.out, "jpeg"), exist_ok=True)
    for i in range(a.count):
        name, img = src[i % len(src)]
        h, w = img.shape[:2]
        s = min(a.size, h, w)
        y, x = rng.randrange(h - s + 1), rng.randrange(w - s + 1)
        crop = Image.fromarray(img[y:y + s, x:x + s])
        if s != a.size:
            crop = crop.resize((a.size, a.size), Image.BILINEAR)
        crop.save(os.path.join(a.out, "jpeg", f"{i:05d}.jpg"), quality=a.quality)

    pngs = 0
    images = os.path.join(a.fashion_mnist, "train-images-idx3-ubyte.gz")
    if not os.path.exists(images):
        images = images[:-3]
    if a.png_count > 0 and os.path.exists(images):
        os.makedirs(os.path.join(a.out, "png"), exist_ok=True)
        imgs = read_idx_images(images)
        for i in range(min(a.png_count, len(imgs))):
            Image.fromarray(imgs[i], "L").save(os.path.join(a.out, "png", f"{i:05d}.png"))
            pngs += 1
    elif a.png_count > 0:
        print(f"make_photos.py: no Fashion-MNIST at {a.fashion_mnist} (Debian: dataset-fashion-mnist): no PNGs",
              file=sys.stderr)

    with open(os.path.join(a.out, "README.txt"), "w") as f:
        f.write(f"made by: python3 benchmarks/data/make_photos.py {a.out} --count {a.count} --size {a.size} "
                f"--quality {a.quality} --seed {a.seed} --png-count {a.png_count}\n"
                f"jpeg/: {a.count} random {a.size}x{a.size} crops (Pillow quality {a.quality}) of skimage.data's "
                f"{', '.join(n for n, _ in src)}\n"
                f"png/: the first {pngs} Fashion-MNIST training images, 28x28 grey PNGs\n")
    print(f"make_photos.py: {a.count} JPEGs from {', '.join(n for n, _ in src)}; {pngs} PNGs in {a.out}")


if __name__ == "__main__":
    main()
