# SPDX-License-Identifier: Apache-2.0
"""Reads the shards loom-shards wrote with PyPI's webdataset, the format's reference reader, and
checks them against loom's manifest and against Python's tarfile: every shard holds the samples the
manifest counts, each sample is a PNG (or JPEG) with its class index in .cls, keys are unique, and
webdataset groups the members exactly as a plain tar reading does. Exits 77 (skipped) when the
webdataset package is missing.

usage: check_webdataset.py SHARD_DIR
"""
import json
import os
import sys
import tarfile

try:
    import webdataset as wds
except ImportError:
    print("PyPI's webdataset is not installed in this Python (scripts/setup puts it in .venv): skipped")
    sys.exit(77)


def main(directory):
    splits = [f[: -len(".shards.json")] for f in sorted(os.listdir(directory)) if f.endswith(".shards.json")]
    assert splits, f"no manifest in {directory}"
    for split in splits:
        with open(os.path.join(directory, split + ".shards.json")) as f:
            manifest = json.load(f)
        assert manifest["loom_shards"] == 1
        total = 0
        for shard in manifest["shards"]:
            path = os.path.join(directory, shard["file"])
            assert os.path.getsize(path) == shard["bytes"], f"{path}: size differs from the manifest's"
            # webdataset, one shard at a time, in order.
            got = []
            for sample in wds.WebDataset(path, shardshuffle=False, empty_check=False):
                image = sample.get("png", sample.get("jpg"))
                assert image is not None, f"{path}: sample {sample['__key__']} has no image"
                assert image[:8] == b"\x89PNG\r\n\x1a\n" or image[:2] == b"\xff\xd8", f"{path}: not a PNG or JPEG"
                label = int(sample["cls"])
                assert 0 <= label < manifest["classes"], f"{path}: label {label} out of range"
                got.append((sample["__key__"], label, len(image)))
            assert len(got) == shard["samples"], f"{path}: webdataset reads {len(got)} samples, manifest says {shard['samples']}"
            # The same with tarfile, grouped by hand.
            expect = {}
            with tarfile.open(path) as t:
                for m in t:
                    key, ext = m.name.split(".", 1)
                    data = t.extractfile(m).read()
                    e = expect.setdefault(key, [None, None])
                    if ext == "cls":
                        e[0] = int(data)
                    else:
                        e[1] = len(data)
            assert [(k, v[0], v[1]) for k, v in expect.items()] == got, f"{path}: webdataset and tarfile disagree"
            total += len(got)
        assert total == manifest["samples"], f"{split}: {total} samples, manifest says {manifest['samples']}"
        print(f"{split}: {len(manifest['shards'])} shards, {total} samples: webdataset {wds.__version__} agrees")
    print("PASS: webdataset reads loom's shards as loom's manifest describes them")


if __name__ == "__main__":
    main(sys.argv[1])
