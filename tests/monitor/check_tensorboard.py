# SPDX-License-Identifier: Apache-2.0
"""Reads loom's TensorBoard event files with TensorBoard's own reader and checks them against the
JSON lines the same run wrote.

usage: check_tensorboard.py LOGDIR JSONL_STEM RANKS STEPS

LOGDIR/rank<r>/ holds rank r's event file, JSONL_STEM.rank<r>.jsonl its JSON lines (one row per
metrics write, written with --monitor-every 0: a row per step and the final state). TensorBoard's
EventAccumulator must read every scalar of every row, at the row's step, with the row's value as
a float (TensorBoard stops reading silently at a damaged record: the counts are asserted), the
end-of-run table of every rank as text, and the hparams plugin's session start and end.
"""

import json
import os
import struct
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import api_pb2, metadata as hparams_metadata

FIGURES = ["compute_s", "comm_s", "comm_exposed_s", "wait_s", "data_s", "bytes_sent", "samples", "seconds",
           "bubble_s", "peak_activation_bytes", "parameter_bytes", "stage", "replica", "step_s", "step_compute_s",
           "step_data_s", "resident_bytes", "comm_bytes", "bus_bytes", "flops", "peak_gflops", "memory_peak_bytes",
           "planned_bytes"]


def f32(x):
    """x as TensorBoard keeps a simple_value: rounded to a float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_scalars(rows):
    """{tag: [(step, value)]} that the writer derives from the JSON rows (see metrics.hpp)."""
    out = {}

    def add(tag, step, v):
        out.setdefault(tag, []).append((step, f32(v)))

    step_time, prev = 0.0, None
    for row in rows:
        s, e = row["step"], row["elapsed_s"]
        if prev is None:
            step_time = e
        elif s > prev[0]:
            step_time = (e - prev[1]) / (s - prev[0])
        prev = (s, e)
        pct = lambda x: 100.0 * x / e if e > 0 else 0.0
        add("train/loss", s, row["loss"])
        add("train/accuracy", s, row["accuracy"])
        add("train/lr", s, row["lr"])
        add("train/samples_per_s", s, row["samples_per_s"])
        add("train/step_time_s", s, step_time)
        add("train/epoch", s, row["epoch"])
        for name in FIGURES:
            add("figures/" + name, s, row[name])
        add("percent/compute", s, pct(row["compute_s"]))
        add("percent/comm_exposed", s, pct(row["comm_exposed_s"]))
        add("percent/wait", s, pct(row["wait_s"]))
        add("percent/data", s, pct(row["data_s"]))
        add("percent/bubble", s, pct(row["bubble_s"]))
        add("process/rss_bytes", s, row["rss_bytes"])
        add("process/peak_rss_bytes", s, row["peak_rss_bytes"])
        add("process/cpu_s", s, row["cpu_s"])
        add("process/cpu_percent", s, row["cpu_percent"])
        add("comm/bus_gbps", s, row["bus_gbps"])
        add("comm/overlap_percent", s, row["overlap_percent"])
        add("compute/achieved_gflops", s, row["achieved_gflops"])
        if row["peak_gflops"] > 0:
            add("compute/peak_percent", s, 100.0 * row["achieved_gflops"] / row["peak_gflops"])
        if "net_received_bytes_per_s" in row:  # the sampler read /proc/net/dev
            add("network/received_bytes_per_s", s, row["net_received_bytes_per_s"])
            add("network/sent_bytes_per_s", s, row["net_sent_bytes_per_s"])
        if "gpu_memory_used_bytes" in row:  # NVML
            add("gpu/memory_used_bytes", s, row["gpu_memory_used_bytes"])
            add("gpu/utilization_percent", s, row["gpu_utilization_percent"])
    return out


def load(run_dir):
    acc = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})  # 0: keep every event
    acc.Reload()
    return acc


def check_rank(logdir, stem, rank, ranks, steps, finals):
    run_dir = os.path.join(logdir, "rank%d" % rank)
    files = [f for f in os.listdir(run_dir) if f.startswith("events.out.tfevents.")]
    assert len(files) == 1, files
    rows = [json.loads(line) for line in open("%s.rank%d.jsonl" % (stem, rank))]
    assert len(rows) == steps + 1, len(rows)
    acc = load(run_dir)
    assert acc.file_version == 2.0, acc.file_version
    want = expected_scalars(rows)
    tags = acc.Tags()
    assert sorted(tags["scalars"]) == sorted(want), (sorted(tags["scalars"]), sorted(want))
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert len(got) == len(points), (tag, len(got), len(points))
        assert got == points, (tag, got, points)
    assert want["train/loss"][0][0] == 1 and want["train/loss"][-1][0] == steps

    # The end of the run: every rank's figures as a Markdown table, and the hparams.
    assert sorted(acc.PluginTagToContent("text")) == ["run/figures", "run/hparams"]
    [table] = acc.Tensors("run/figures")
    assert table.step == steps, table.step
    text = table.tensor_proto.string_val[0].decode()
    lines = text.splitlines()
    assert lines[0] == "| rank | " + " | ".join(FIGURES) + " | samples_per_s |", lines[0]
    assert len(lines) == 2 + ranks, text
    for r, final in enumerate(finals):
        cells = ["%d" % r] + ["%.6g" % final[name] for name in FIGURES]
        assert lines[2 + r].startswith("| " + " | ".join(cells) + " | "), (lines[2 + r], cells)
    [hp_text] = acc.Tensors("run/hparams")
    assert "| model | mlp |" in hp_text.tensor_proto.string_val[0].decode()

    content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    assert sorted(content) == [hparams_metadata.SESSION_END_INFO_TAG, hparams_metadata.SESSION_START_INFO_TAG]
    start = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
    hp = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert hp["model"] == "mlp" and hp["optimizer"] == "sgd", hp
    assert hp["batch"] == 64 and hp["lr"] == 0.02 and hp["ranks"] == ranks and hp["max_steps"] == steps, hp
    end = hparams_metadata.parse_session_end_info_plugin_data(content[hparams_metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS, end
    assert end.end_time_secs >= start.start_time_secs > 1.6e9, (start, end)
    print("rank %d: %d scalar tags x %d events, text and hparams as written" % (rank, len(want), len(rows)))
    return files[0], len(want)


def check_damage_is_seen(run_dir, name, tags, steps):
    """A flipped byte in a middle record: TensorBoard reads less, without an error. So the counts
    above are what catches a bad record."""
    with tempfile.TemporaryDirectory() as tmp:
        data = bytearray(open(os.path.join(run_dir, name), "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(os.path.join(tmp, name), "wb").write(data)
        acc = load(tmp)
        n = sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"])
        assert n < tags * (steps + 1), n
        print("damaged copy: TensorBoard reads %d of %d scalars, silently" % (n, tags * (steps + 1)))


def main():
    logdir, stem, ranks, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    finals = [json.loads(open("%s.rank%d.jsonl" % (stem, r)).readlines()[-1]) for r in range(ranks)]
    checked = [check_rank(logdir, stem, r, ranks, steps, finals) for r in range(ranks)]
    name, tags = checked[0]
    check_damage_is_seen(os.path.join(logdir, "rank0"), name, tags, steps)

if __name__ == "__main__":
    main()
