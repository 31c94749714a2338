# SPDX-License-Identifier: Apache-2.0
"""The recipe options against PyTorch (after recipe_fixtures write DIR):

check_recipe_torch.py DIR
  1. label smoothing: torch.nn.functional.cross_entropy(label_smoothing=eps) of the logits in
     recipe_loss.safetensors, and its gradient, against loom's (1e-6, relative to 1 + |value|);
  2. decay_norm_and_bias = false: the same conv + batch_norm + linear + layer_norm network built
     as a torch.nn.Sequential with loom's initial weights, 3 steps of torch.optim.SGD with two
     parameter groups as torchvision's reference scripts make them (--norm-weight-decay 0
     --bias-weight-decay 0: the parameters of normalization layers and every bias without weight
     decay) and cross_entropy with label smoothing, against loom's losses and final weights
     (1e-5 per value, relative to 1 + |value|). It also shows that decaying everything lands
     farther than that (the comparison can tell them apart).
Exits 77 (skipped) without torch."""

import os
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"check_recipe_torch.py: {e}: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import safetensors_io  # noqa: E402

TOLERANCE = 1e-5


def worst(a, b):
    return ((a.double() - b.double()).abs() / (1 + a.double().abs())).max().item()


def check_loss(d):
    t = safetensors_io.load(os.path.join(d, "recipe_loss.safetensors"))
    labels = t["labels"].long()
    bad = 0.0
    for i, eps in enumerate(t["eps"].tolist()):
        z = t["logits"].double().clone().requires_grad_(True)
        loss = F.cross_entropy(z, labels, label_smoothing=eps)
        loss.backward()
        e_loss = abs(loss.item() - t["losses"][i].item()) / (1 + abs(loss.item()))
        e_grad = worst(z.grad, t["grads"][i])
        print(f"label_smoothing {eps:.2f}: loss torch {loss.item():.7f} loom {t['losses'][i].item():.7f} "
              f"({e_loss:.1e}); gradient worst {e_grad:.1e}")
        bad = max(bad, e_loss, e_grad)
    return bad


def model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(784, 16),
                         nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 10))


def param_groups(m, weight_decay, skip):
    """torchvision.ops._utils.split_normalization_params with norm_weight_decay = bias_weight_decay = 0."""
    norm_classes = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm,
                    nn.LocalResponseNorm)
    decay, none = [], []
    for module in m.modules():
        for name, p in module.named_parameters(recurse=False):
            if skip and (isinstance(module, norm_classes) or name == "bias"):
                none.append(p)
            else:
                decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": none, "weight_decay": 0.0}]


def train(d, run, skip):
    lr, momentum, weight_decay, smoothing = run["settings"].tolist()
    m = model()
    m.load_state_dict(safetensors_io.load(os.path.join(d, "recipe_init.safetensors")), strict=True)
    m.train()
    opt = torch.optim.SGD(param_groups(m, weight_decay, skip), lr=lr, momentum=momentum)
    losses = []
    for _ in range(len(run["losses"])):
        opt.zero_grad()
        loss = F.cross_entropy(m(run["x"]), run["labels"].long(), label_smoothing=smoothing)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, m.state_dict()


def compare(state, final):
    bad = 0.0
    for name, t in state.items():
        if t.dtype == torch.int64:
            bad = max(bad, 0.0 if torch.equal(t, final[name]) else 1.0)
        else:
            bad = max(bad, worst(t, final[name]))
    return bad


def main(d):
    torch.set_num_threads(2)
    loss_bad = check_loss(d)
    run = safetensors_io.load(os.path.join(d, "recipe_run.safetensors"))
    final = safetensors_io.load(os.path.join(d, "recipe_final.safetensors"))
    losses, state = train(d, run, skip=True)
    assert set(final) == set(state), "the final weights do not hold the module's tensors"
    loss_steps = max(abs(a - b) / (1 + abs(a)) for a, b in zip(losses, run["losses"].tolist()))
    values = compare(state, final)
    _, everything = train(d, run, skip=False)
    apart = compare(everything, final)
    print(f"decay_norm_and_bias = false against torch param groups: losses {loss_steps:.1e}, final values {values:.1e}; "
          f"torch decaying everything is {apart:.1e} away")
    ok = loss_bad <= TOLERANCE and loss_steps <= TOLERANCE and values <= TOLERANCE and apart > 10 * TOLERANCE
    print("all checks passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
