# SPDX-License-Identifier: Apache-2.0
"""loom's resnet_cifar<20> against the same network in PyTorch: 20 SGD steps with momentum on the
same batches, in fp32, one process.

check_cifar_sgd.py DIR   (after models_fixtures write DIR): builds He et al.'s CIFAR ResNet-20 with
option B shortcuts as a PyTorch module with loom's names, loads loom's initial weights
(cifar_init.safetensors, strict), trains on the batches of cifar_run.safetensors with
torch.optim.SGD at loom's learning rate and momentum, and compares: the loss at every step
within 1e-4 relative of loom's, and at the end every parameter and running statistic within
1e-4 (|torch - loom| <= 1e-4 (1 + |torch|) per value, torch.allclose's rule with rtol = atol =
1e-4; num_batches_tracked exactly), and the whole parameter vector within 1e-4 relative in the
2-norm.
It also prints the floor of such comparisons: PyTorch against itself with its initial weights
moved by 1e-7 of themselves (float's rounding, which any two implementations differ by).
Exits 77 (skipped) without torch."""

import os
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"check_cifar_sgd.py: {e}: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

TOLERANCE = 1e-4


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:  # option B
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


class CifarResNet(nn.Module):
    def __init__(self, depth=20, classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        inplanes = 16
        for k, (planes, stride) in enumerate([(16, 1), (32, 2), (64, 2)], start=1):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes
            setattr(self, f"layer{k}", nn.Sequential(*blocks))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def train(d, run, perturb=0.0):
    """PyTorch's 20 steps from loom's initial weights (moved by `perturb` of themselves): the
    losses and the final state."""
    torch.manual_seed(1)
    model = CifarResNet()
    model.load_state_dict(safetensors_io.load(os.path.join(d, "cifar_init.safetensors")), strict=True)
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn_like(p))
    lr, momentum = (float(v) for v in run["lr_momentum"])
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for s in range(run["x"].shape[0]):
        opt.zero_grad()
        loss = F.cross_entropy(model(run["x"][s]), run["labels"][s].long())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


def compare(state, final):
    """The largest |a - b| / (1 + |a|) over every value, its tensor, the whole parameter vector's
    |a - b| / |a| (2-norm), and whether the counts agree."""
    worst, where, counts_ok = 0.0, "", True
    diff2, norm2 = 0.0, 0.0
    for name, t in state.items():
        ours = final[name]
        if t.dtype == torch.int64:
            counts_ok = counts_ok and torch.equal(t, ours)
            continue
        e = ((t - ours).abs() / (1 + t.abs())).max().item()
        if e > worst:
            worst, where = e, name
        if "running" not in name:
            diff2 += (t - ours).double().pow(2).sum().item()
            norm2 += t.double().pow(2).sum().item()
    return worst, where, (diff2 / norm2) ** 0.5, counts_ok


def main(d):
    torch.set_num_threads(2)
    run = safetensors_io.load(os.path.join(d, "cifar_run.safetensors"))
    losses, state = train(d, run)
    worst_loss = 0.0
    for s, (theirs, ours) in enumerate(zip(losses, run["losses"].tolist())):
        rel = abs(theirs - ours) / abs(theirs)
        worst_loss = max(worst_loss, rel)
        print(f"step {s + 1:2d}: loss torch {theirs:.7f} loom {ours:.7f} relative difference {rel:.2e}")
    final = safetensors_io.load(os.path.join(d, "cifar_final.safetensors"))
    assert set(final) == set(state), "the final weights do not hold the module's tensors"
    worst_value, worst_name, whole, counts_ok = compare(state, final)
    print(f"{len(losses)} steps: worst loss difference {worst_loss:.2e} (relative); at the end, parameters and running "
          f"statistics: worst |torch - loom| / (1 + |torch|) {worst_value:.2e} ({worst_name}), the parameter vector "
          f"{whole:.2e} (relative, 2-norm); num_batches_tracked {'equal' if counts_ok else 'DIFFERENT'}")
    floor_losses, floor_state = train(d, run, perturb=1e-7)
    floor_loss = max(abs(a - b) / abs(a) for a, b in zip(losses, floor_losses))
    floor_value, _, floor_whole, _ = compare(state, floor_state)
    print(f"the floor (PyTorch against itself, initial weights moved by 1e-7): losses {floor_loss:.2e}, values "
          f"{floor_value:.2e}, parameter vector {floor_whole:.2e}")
    return 0 if worst_loss <= TOLERANCE and worst_value <= TOLERANCE and whole <= TOLERANCE and counts_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
