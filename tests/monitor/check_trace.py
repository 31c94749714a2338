# SPDX-License-Identifier: Apache-2.0
"""Structural check of a loom Chrome trace (the JSON Perfetto and chrome://tracing import):
every event has the fields its phase needs; complete events nest strictly per (pid, tid), as
the format requires of one thread; each rank is named; each rank has the expected number of
steps, each holding at least one compute span; gradient buckets' collectives (when the run has
any) lie on their own named threads with their bytes and bandwidths, every rank has the same
number, each flow begins at a post inside a span of thread 0 and ends once, no earlier, and in
a file of several ranks each collective carries the rank's arrival (late_ms, 0 for the first
rank to arrive); counters carry a number. Usage: check_trace.py FILE PIDS STEPS, PIDS the
ranks the file holds, comma-separated (0,1)."""
import collections
import json
import sys

path, steps = sys.argv[1], int(sys.argv[3])
ranks = [int(r) for r in sys.argv[2].split(",")]
with open(path) as f:
    trace = json.load(f)
events = trace["traceEvents"]
for e in events:
    for key in ("name", "ph", "pid", "tid"):
        assert key in e, (key, e)
names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert names == {r: f"rank {r}" for r in ranks}, names
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
complete = [e for e in events if e["ph"] == "X"]
for e in complete:
    for key in ("ts", "dur"):
        assert key in e, (key, e)
    assert e["dur"] >= 0, e

# Nesting per thread.
by_thread = collections.defaultdict(list)
for e in complete:
    by_thread[(e["pid"], e["tid"])].append(e)
for (pid, tid), mine in by_thread.items():
    mine.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in mine:
        # Times are printed to the nanosecond (exactly: loom records integer nanoseconds);
        # allow for Python's float sums at a shared edge.
        while stack and stack[-1] <= e["ts"] + 1e-4:
            stack.pop()
        assert not stack or e["ts"] + e["dur"] <= stack[-1] + 1e-3, ("overlapping spans", pid, tid, e)
        stack.append(e["ts"] + e["dur"])
    if tid != 0:
        assert (pid, tid) in threads, ("an unnamed thread", pid, tid)

collectives = {}
for r in ranks:
    main = by_thread[(r, 0)]
    step_spans = [e for e in main if e["name"] == "step"]
    assert len(step_spans) == steps, (r, len(step_spans))
    for s in step_spans:
        inside = [e for e in main if e["name"] == "compute" and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        assert inside, ("a step without compute", r, s)
    mine = [e for e in complete if e["pid"] == r and e.get("cat") == "bucket"]
    for e in mine:
        a = e["args"]
        assert e["tid"] != 0 and threads[(r, e["tid"])] == f"bucket {a['bucket']}", e
        assert e["name"] == f"allreduce bucket {a['bucket']}", e
        assert a["bytes"] > 0 and a["ranks"] >= 1 and a["algbw_GBps"] >= 0 and a["busbw_GBps"] >= 0, e
        if len(ranks) > 1:
            assert "late_ms" in a and a["late_ms"] >= 0, ("a collective without its arrival", e)
    collectives[r] = mine
counts = {r: len(c) for r, c in collectives.items()}
assert len(set(counts.values())) == 1, ("ranks differ in their collectives", counts)
if len(ranks) > 1 and counts[ranks[0]] > 0:
    # The first rank to arrive at each collective is 0 ms late.
    earliest = collections.defaultdict(lambda: float("inf"))
    for c in collectives.values():
        seen = collections.Counter()
        for e in sorted(c, key=lambda e: e["ts"]):
            k = (e["args"]["step"], e["args"]["bucket"], seen[(e["args"]["step"], e["args"]["bucket"])])
            seen[k[:2]] += 1
            earliest[k] = min(earliest[k], e["args"]["late_ms"])
    assert all(abs(v) < 1e-3 for v in earliest.values()), ("no rank first at a collective", earliest)

# Flows: each id begun once on thread 0 inside one of its spans, ended once there no earlier.
begins = {e["id"]: e for e in events if e["ph"] == "s"}
ends = {e["id"]: e for e in events if e["ph"] == "f"}
assert len(begins) == len([e for e in events if e["ph"] == "s"]), "a flow id begun twice"
assert begins.keys() == ends.keys(), ("flows begun and not ended, or ended and not begun",
                                      sorted(begins.keys() ^ ends.keys())[:10])
assert len(begins) == sum(counts.values()), ("a flow per collective", len(begins), counts)
for i, s in begins.items():
    f = ends[i]
    assert s["pid"] == f["pid"] and s["tid"] == f["tid"] == 0 and f.get("bp") == "e", (s, f)
    assert f["ts"] >= s["ts"], (s, f)
    for ev in (s, f):
        assert any(x["ts"] <= ev["ts"] + 1e-3 and ev["ts"] <= x["ts"] + x["dur"] + 1e-3 for x in by_thread[(ev["pid"], 0)]), \
            ("a flow point outside every span of its thread", ev)

counters = [e for e in events if e["ph"] == "C"]
for e in counters:
    assert "ts" in e and all(isinstance(v, (int, float)) for v in e["args"].values()), e
print(f"{path}: {len(complete)} spans, ranks {ranks} x {steps} steps, nested; "
      f"{sum(counts.values())} collectives, {len(begins)} flows, {len(counters)} counter samples")
