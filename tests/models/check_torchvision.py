# SPDX-License-Identifier: Apache-2.0
"""loom's resnet<18> and torchvision.models.resnet18 read each other's weights.

check_torchvision.py DIR
  1. loads loom's resnet18.safetensors (models_fixtures write) into torchvision.models.resnet18()
     with load_state_dict(strict=True) and compares its evaluation logits with loom's
     (resnet18.io.safetensors): max |difference| at most 1e-5 of the largest logit;
  2. saves a torchvision resnet18 of its own (random, its running statistics moved by three
     training forwards) as torchvision_resnet18.safetensors with an input and its logits
     (torchvision_resnet18.io.safetensors), for `models_fixtures check-torch DIR`.
Exits 77 (skipped) without torch and torchvision."""

import os
import sys

try:
    import torch
    import torchvision
except ImportError as e:  # the check needs both; skipped, not failed, where they are missing
    print(f"check_torchvision.py: {e}: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

TOLERANCE = 1e-5


def main(d):
    torch.manual_seed(0)
    torch.set_num_threads(2)
    # 1. loom's weights in torchvision's model.
    model = torchvision.models.resnet18()
    weights = safetensors_io.load(os.path.join(d, "resnet18.safetensors"))
    model.load_state_dict(weights, strict=True)
    model.eval()
    io = safetensors_io.load(os.path.join(d, "resnet18.io.safetensors"))
    with torch.no_grad():
        y = model(io["input"])
    diff = (y - io["logits"]).abs().max().item()
    rel = diff / io["logits"].abs().max().item()
    print(f"torchvision reads loom's resnet18: {len(weights)} tensors, max |torchvision - loom| logit {diff:.3g}, "
          f"relative to the largest {rel:.3g} (bn1.num_batches_tracked {int(weights['bn1.num_batches_tracked'])})")
    ok = rel <= TOLERANCE and weights["bn1.num_batches_tracked"].dtype == torch.int64

    # 2. torchvision's weights for loom.
    theirs = torchvision.models.resnet18()
    theirs.train()
    with torch.no_grad():
        for _ in range(3):
            theirs(torch.randn(4, 3, 224, 224))
    theirs.eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        logits = theirs(x)
    safetensors_io.save(theirs.state_dict(), os.path.join(d, "torchvision_resnet18.safetensors"))
    safetensors_io.save({"input": x, "logits": logits}, os.path.join(d, "torchvision_resnet18.io.safetensors"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
