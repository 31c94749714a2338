# SPDX-License-Identifier: Apache-2.0
"""Structural check of a loom Chrome trace (the JSON Perfetto and chrome://tracing import):
every event has the fields its phase needs, complete events nest strictly per (pid, tid) as
the format requires of one thread, each rank is named, and each rank has the expected number
of steps, each holding at least one compute span. Usage: check_trace.py FILE PIDS STEPS, PIDS
the ranks the file holds, comma-separated (0,1)."""
import json
import sys

path, steps = sys.argv[1], int(sys.argv[3])
ranks = [int(r) for r in sys.argv[2].split(",")]
with open(path) as f:
    trace = json.load(f)
events = trace["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert names == {r: f"rank {r}" for r in ranks}, names
complete = [e for e in events if e["ph"] == "X"]
for e in complete:
    for key in ("name", "pid", "tid", "ts", "dur"):
        assert key in e, (key, e)
    assert e["dur"] >= 0, e
for r in ranks:
    mine = sorted((e for e in complete if e["pid"] == r), key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in mine:
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        # Times are printed to the nanosecond: allow that much rounding at an edge.
        assert not stack or e["ts"] + e["dur"] <= stack[-1] + 1e-3, ("overlapping spans", r, e)
        stack.append(e["ts"] + e["dur"])
    step_spans = [e for e in mine if e["name"] == "step"]
    assert len(step_spans) == steps, (r, len(step_spans))
    for s in step_spans:
        inside = [e for e in mine if e["name"] == "compute" and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        assert inside, ("a step without compute", r, s)
print(f"{path}: {len(complete)} spans, ranks {ranks} x {steps} steps, nested")
