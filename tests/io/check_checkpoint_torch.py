# SPDX-License-Identifier: Apache-2.0
"""A loom checkpoint read by PyTorch and Hugging Face's safetensors: the sharded weights of a
2-rank data-parallel run (model-0000k-of-00002.safetensors and model.safetensors.index.json, as
Hugging Face shards) load with load_state_dict(strict=True) into the torch.nn.Sequential of the
same layers, equal to the single file --save-weights wrote at the same step, and compute the same
outputs; the optimizer state is keyed by parameter name as torch.optim names its state
(momentum_buffer for SGD), with each tensor's CRC-32C in its file's metadata.

usage: check_checkpoint_torch.py STEP_DIR WEIGHTS_FILE"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from common import cli, finish


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def load_sharded(step, index_name):
    index = json.load(open(os.path.join(step, index_name)))
    tensors, total = {}, 0
    for name in sorted(set(index["weight_map"].values())):
        part = load_file(os.path.join(step, name))
        for k, v in part.items():
            assert index["weight_map"][k] == name, f"{k} is in {name}, its index says {index['weight_map'][k]}"
            tensors[k] = v
            total += v.numel() * v.element_size()
    assert set(tensors) == set(index["weight_map"]), "the shards and the index name different tensors"
    assert total == index["metadata"]["total_size"], f"total_size {index['metadata']['total_size']}, tensors {total}"
    return tensors, sorted(set(index["weight_map"].values()))


def main(step, weights):
    failures, checks = 0, 0

    def check(ok, what):
        nonlocal failures, checks
        checks += 1
        if not ok:
            failures += 1
            print("FAIL:", what)

    state, shards = load_sharded(step, "model.safetensors.index.json")
    check(len(shards) == 2, f"two shards from two ranks, got {shards}")
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    result = model.load_state_dict(state, strict=True)
    check(not result.missing_keys and not result.unexpected_keys, f"strict load: {result}")
    single = load_file(weights)
    for k, v in single.items():
        check(torch.equal(state[k], v), f"{k}: the checkpoint's shard and the --save-weights file differ")
    x = torch.rand(16, 784)
    reference = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                    torch.nn.ReLU(), torch.nn.Linear(128, 10))
    reference.load_state_dict(single, strict=True)
    with torch.no_grad():
        check(torch.equal(model(x), reference(x)), "outputs differ")
    # Each tensor's CRC-32C, as the metadata says (checked on two small tensors: pure Python).
    # (The raw bytes from the file itself, as the format lays them out: Debian's torch cannot
    # hand tensors to the venv's NumPy 2.)
    for name in shards:
        with safe_open(os.path.join(step, name), framework="pt") as f:
            meta = f.metadata()
        crcs = dict(item.rsplit("=", 1) for item in meta["loom.crc32c"].split(","))
        check(meta.get("format") == "pt", f"{name}: __metadata__ format is {meta.get('format')}")
        raw = open(os.path.join(step, name), "rb").read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        for k, entry in header.items():
            if k.endswith("bias"):
                begin, end = entry["data_offsets"]
                got = "%08x" % crc32c(raw[8 + n + begin:8 + n + end])
                check(got == crcs[k], f"{name}: {k} has CRC-32C {got}, its metadata says {crcs[k]}")
    opt, _ = load_sharded(step, "optimizer.safetensors.index.json")
    check(set(opt) == {k + ".momentum_buffer" for k in state}, f"optimizer state keys: {sorted(opt)}")
    for k, v in opt.items():
        check(v.shape == state[k.rsplit(".", 1)[0]].shape, f"{k}: shape {tuple(v.shape)}")
    manifest = json.load(open(os.path.join(step, "checkpoint.json")))
    check(manifest["format"] == "loom-checkpoint" and manifest["format_version"] == 1, "checkpoint.json's format")
    check(manifest["ranks"] == 2 and manifest["optimizer"] == "sgd", "checkpoint.json's world and optimizer")
    check({f["name"] for f in manifest["files"]} == {n for n in os.listdir(step) if n.endswith(".safetensors")},
          "checkpoint.json lists exactly the tensor files")
    return finish(os.path.basename(__file__), failures, f"{checks} checks passed")


if __name__ == "__main__":
    cli(main, __doc__, 2)
