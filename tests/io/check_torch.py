# SPDX-License-Identifier: Apache-2.0
"""Checks loom's weights files (written by `io_fixtures write DIR`) with PyTorch and the
safetensors package, and writes PyTorch's own weights for loom to read back.

For every case: the torch.nn.Sequential of the same layers, written out here by hand, loads
CASE.safetensors with load_state_dict(strict=True) (so the names and shapes are PyTorch's) and
computes loom's outputs at batch 1 and 7 within 1e-5 relative. Then a freshly initialised
Sequential's state_dict is saved with safetensors.torch.save_file as CASE.torch.safetensors, with
its outputs on the same inputs in CASE.torch_out.safetensors, for `io_fixtures check-torch DIR`.
Exit status 1 on any failure.

usage: check_torch.py DIR
"""
import sys
import warnings

# Debian's torch 1.13 was built against NumPy 1 and the venv has NumPy 2 (for onnx): torch's
# NumPy bridge is off, which nothing here uses.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
try:
    import torch
    from torch import nn
    import safetensors.torch
    from common import cli, finish
except ImportError as e:
    sys.exit(f"check_torch.py: {e}: the io tests' Python environment is incomplete (Debian's python3-torch and "
             f"the venv's safetensors); run `bash scripts/setup`")


class Residual(nn.Sequential):
    """loom::residual<...>: x + inner(x); its layers are named <index>.<inner index> as in loom."""

    def forward(self, x):
        return x + super().forward(x)


def cases():
    S = nn.Sequential
    return {
        "linear": S(nn.Linear(20, 7)),
        "conv2d": S(nn.Conv2d(3, 4, 3, stride=2, padding=1)),
        "relu": S(nn.ReLU()),
        "leaky_relu": S(nn.LeakyReLU(0.01)),
        "tanh": S(nn.Tanh()),
        "sigmoid": S(nn.Sigmoid()),
        "gelu": S(nn.GELU()),
        "max_pool2d": S(nn.MaxPool2d(3, stride=2)),
        "avg_pool2d": S(nn.AvgPool2d(2)),
        "flatten": S(nn.Flatten()),
        "layer_norm": S(nn.LayerNorm((3, 4, 5), eps=1e-5)),
        "dropout": S(nn.Dropout(0.5)),
        "residual": S(Residual(nn.Linear(16, 16), nn.Tanh())),
        "mlp": S(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)),
        "cnn": S(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                 nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                 nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)),
        "res_ln": S(nn.Conv2d(1, 4, 3, padding=1),
                    Residual(nn.LayerNorm((4, 12, 12)), nn.Conv2d(4, 4, 3, padding=1), nn.GELU()),
                    nn.MaxPool2d(2), nn.Flatten(),
                    nn.Linear(4 * 6 * 6, 32), nn.LayerNorm(32),
                    Residual(nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 32)),
                    nn.LeakyReLU(0.01), nn.Sigmoid(), nn.Linear(32, 10)),
    }


def errors(actual, expected):
    """Relative errors of a whole output, in the 2-norm and in the max norm (see check_onnx.py)."""
    a, e = actual.double(), expected.double()
    if a.shape != e.shape:
        return float("inf"), float("inf")
    n2, nmax = e.norm().item(), e.abs().max().item()
    if n2 == 0:
        return (0.0, 0.0) if torch.equal(a, e) else (float("inf"), float("inf"))
    return (a - e).norm().item() / n2, (a - e).abs().max().item() / nmax


def main(d):
    torch.manual_seed(3)
    failures = 0
    worst = 0.0
    for case, model in cases().items():
        model.eval()
        base = f"{d}/{case}"
        io = safetensors.torch.load_file(f"{base}.io.safetensors")
        state = safetensors.torch.load_file(f"{base}.safetensors")
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            print(f"  FAILED: {base}.safetensors does not load into the Sequential: {e}")
            failures += 1
            continue
        line = []
        with torch.no_grad():
            for b in ["1", "7"]:
                e2, emax = errors(model(io["x" + b]), io["y" + b])
                worst = max(worst, e2, emax)
                line.append(f"b{b} {e2:.1e}/{emax:.1e}")
                if not (e2 <= 1e-5 and emax <= 1e-5):
                    print(f"  FAILED: {case}: batch {b}: PyTorch with loom's weights vs loom: relative error "
                          f"{e2:.3g} (2-norm), {emax:.3g} (max) > 1e-5")
                    failures += 1
            # PyTorch's own weights, for loom to load: a fresh model, every tensor moved off its
            # initial value (LayerNorm's 1 and 0) so a misplaced one shows.
            fresh = cases()[case].eval()
            for p in fresh.parameters():
                p.add_(0.1 * torch.randn_like(p))
            safetensors.torch.save_file(fresh.state_dict(), f"{base}.torch.safetensors")
            safetensors.torch.save_file({"y7": fresh(io["x7"]).contiguous()}, f"{base}.torch_out.safetensors")
        print(f"{case:12s} loom's weights in PyTorch vs loom (2-norm/max): " + ", ".join(line))
    print(f"worst relative error {worst:.2e}")
    return finish("check_torch.py", failures, "every case loaded with strict=True and agreed")


if __name__ == "__main__":
    cli(main, __doc__, 1)
