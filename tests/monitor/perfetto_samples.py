# SPDX-License-Identifier: Apache-2.0
"""Writes small hand-made Chrome traces in loom's shapes, for testing perfetto_check.py (and
check_trace.py) on what the example does not write yet. Usage: perfetto_samples.py DIR; each
file is for RANKS 0,1 and STEPS 4, and perfetto_check.py must pass or fail it as its name says:

- pass-spans.json: today's timeline (tid 0: step holding data, compute, comm_exposed, wait);
- pass-buckets.json: plus a thread per gradient bucket ("bucket <b>", tid 1000 + b) holding
  its "allreduce bucket <b>" spans, a flow (ph s at the bucket's post inside backward on tid 0,
  ph f with bp e on tid 0 where it completed, inside comm_exposed; cat "bucket", an id
  unique in the merged file) per bucket and step, and counters rss_bytes and bus_GBps;
- fail-overlap.json: two X spans that overlap on one thread, and rank 1 a step short;
- fail-flow-ids.json: pass-buckets with flow ids that repeat on both ranks (each rank counted
  from 0), so the merged file's flows pair up across ranks;
- fail-bucket-tids.json: pass-buckets with bucket b on tid 1 + b: Perfetto reads tid 0 as the
  main thread, tid = pid, so rank 1's bucket 0 lands on its main thread, where its spans
  overlap the steps and are dropped;
- fail-flow-open.json: pass-buckets with one flow of rank 1 that has no end.
"""
import json
import os
import sys

STEPS, BUCKETS = 4, 2


def meta(pid):
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]


def x(name, pid, tid, ts, dur, step):
    return {"name": name, "cat": "loom", "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"step": step}}


def spans(pid, steps=STEPS, buckets=False, flow_id=lambda pid, step, b: (pid << 20) | (step * BUCKETS + b),
          bucket_tid=lambda b: 1000 + b):
    """One rank: 1000 us steps, 900 us of step span; with buckets, backward posts bucket b at
    400 + 100 b us, whose allreduce runs 250 us on its own thread; comm_exposed waits for the
    last (each flow ends in it), then the optimizer runs."""
    ev = meta(pid)
    if buckets:
        ev += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "training"}}]
        ev += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": bucket_tid(b), "args": {"name": f"bucket {b}"}}
               for b in range(BUCKETS)]
    for s in range(steps):
        t = 100.0 + 1000 * s + 3 * pid
        ev += [x("step", pid, 0, t, 900, s), x("data", pid, 0, t + 1, 50, s), x("compute", pid, 0, t + 60, 560, s)]
        if buckets:
            ev += [x("forward", pid, 0, t + 61, 250, s), x("backward", pid, 0, t + 320, 299, s)]
            for b in range(BUCKETS):
                post, fid = t + 400 + 100 * b, flow_id(pid, s, b)
                ev += [{"name": "bucket", "cat": "bucket", "ph": "s", "pid": pid, "tid": 0, "ts": post, "id": fid},
                       x(f"allreduce bucket {b}", pid, bucket_tid(b), post + 1, 250, s),
                       {"name": "bucket", "cat": "bucket", "ph": "f", "bp": "e", "pid": pid, "tid": 0,
                        "ts": post + 251, "id": fid}]
            ev += [x("comm_exposed", pid, 0, t + 621, 131, s), x("compute", pid, 0, t + 755, 40, s),
                   x("optimizer", pid, 0, t + 756, 38, s)]
            ev += [{"name": "rss_bytes", "ph": "C", "pid": pid, "tid": 0, "ts": t + 899, "args": {"value": 5e7 + s * 4096}},
                   {"name": "bus_GBps", "ph": "C", "pid": pid, "tid": 0, "ts": t + 899, "args": {"value": 1.5 + 0.1 * s}}]
        else:
            ev += [x("comm_exposed", pid, 0, t + 621, 100, s), x("compute", pid, 0, t + 725, 60, s)]
        ev += [x("wait", pid, 0, t + 800, 50, s)]
    return ev


def write(d, name, events):
    with open(os.path.join(d, name), "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": events}, f)


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    write(d, "pass-spans.json", spans(0) + spans(1))
    write(d, "pass-buckets.json", spans(0, buckets=True) + spans(1, buckets=True))
    overlap = spans(0) + spans(1, steps=STEPS - 1)
    overlap.append(x("compute", 0, 0, 100.0 + 1000 * 2 + 600, 400, 2))  # crosses step 2's end
    write(d, "fail-overlap.json", overlap)
    same = lambda pid, step, b: step * BUCKETS + b  # noqa: E731
    write(d, "fail-flow-ids.json", spans(0, buckets=True, flow_id=same) + spans(1, buckets=True, flow_id=same))
    write(d, "fail-bucket-tids.json", spans(0, buckets=True, bucket_tid=lambda b: 1 + b)
          + spans(1, buckets=True, bucket_tid=lambda b: 1 + b))
    open_ = spans(0, buckets=True) + spans(1, buckets=True)
    open_.remove(next(e for e in open_ if e["ph"] == "f" and e["pid"] == 1))
    write(d, "fail-flow-open.json", open_)

if __name__ == "__main__":
    main()
