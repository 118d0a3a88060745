"""Record trace v1 files (CONTRACT.md) from real trainers, several side by side.

Stdlib only. A plan (JSON) holds lanes; the lanes run at the same time, the runs
of one lane one after another. Each run is a trainer started as a subprocess with
its profile's env; its merged stdout/stderr is read with a timestamp per chunk and
split on \\n, \\r and \\r\\n (the supervisor's LineSplitter rule: empty lines kept),
its checkpoint folder is polled every 0.2 s for files that appear, change (size or
mtime) or go, and everything is written, in time order, to ``<out>/<name>.jsonl.gz``:

  line 1  {"trace": 1, "name", "job": null, "recorded_by", "meta": {...}}
  then    {"t", "run": {...}} / {"t", "out": line} / {"t", "ckpt", "op", "size"} / {"t", "exit"}

A run past its ``timeout`` gets SIGABRT (the trainers run with PYTHONFAULTHANDLER=1,
so every thread's Python stack lands in the trace), then SIGKILL 15 s later.
``<out>/runs.json`` lists every run with its start, end, exit and whether it timed
out, so which runs overlapped (ran side by side) can be read from it.

  python3 record_traces.py --plan plan.json --out DIR [--deadline 540]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

_EOL = re.compile(rb"\r\n|\r|\n")
POLL_S = 0.2


class Splitter:
    """Bytes -> lines on \\n, \\r, \\r\\n; a \\r\\n split across chunks counts once."""

    def __init__(self):
        self.buf = b""
        self.skip_lf = False

    def feed(self, data: bytes) -> list:
        if self.skip_lf and data[:1] == b"\n":
            data = data[1:]
        self.skip_lf = False
        out, pos = [], 0
        for m in _EOL.finditer(data):
            out.append((self.buf + data[pos:m.start()]).decode("utf-8", "replace"))
            self.buf, pos = b"", m.end()
        if data.endswith(b"\r"):
            self.skip_lf = True
        self.buf += data[pos:]
        if len(self.buf) > 65536:
            out.append(self.buf.decode("utf-8", "replace"))
            self.buf = b""
        return out

    def close(self) -> list:
        rest, self.buf = self.buf, b""
        return [rest.decode("utf-8", "replace")] if rest else []


class TraceWriter:
    """One trace file, written as it goes (flushed every second: a kill loses ~1 s)."""

    def __init__(self, path: str, header: dict):
        self.f = gzip.open(path, "wt", encoding="utf-8", compresslevel=9)
        self.lock = threading.Lock()
        self.last_flush = time.time()
        self.count = 0
        self.last_t = 0.0
        self._write(header)

    def _write(self, rec: dict) -> None:
        self.f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")

    def add(self, rec: dict) -> None:
        with self.lock:
            # the reader stamps a chunk before it takes the lock, the poller may write in between:
            # keep the file in time order (a shift of microseconds)
            if rec["t"] < self.last_t:
                rec["t"] = self.last_t
            self.last_t = rec["t"]
            self._write(rec)
            self.count += 1
            if time.time() - self.last_flush > 1.0:
                self.f.flush()
                self.last_flush = time.time()

    def close(self) -> None:
        with self.lock:
            self.f.close()


def scan(root: str, rel_to: str) -> dict:
    """{relative path: (size, mtime_ns)} of every file under root (a file or a folder)."""
    found = {}
    if os.path.isfile(root):
        items = [root]
    else:
        items = []
        for d, _dirs, files in os.walk(root):
            items.extend(os.path.join(d, f) for f in files)
    for p in items:
        try:
            st = os.stat(p)
        except OSError:
            continue
        found[os.path.relpath(p, rel_to)] = (st.st_size, st.st_mtime_ns)
    return found


def diff(old: dict, new: dict, t: float) -> list:
    events = []
    for p, (size, mt) in new.items():
        if p not in old:
            events.append({"t": t, "ckpt": p, "op": "new", "size": size})
        elif old[p] != (size, mt):
            events.append({"t": t, "ckpt": p, "op": "changed", "size": size})
    for p in old:
        if p not in new:
            events.append({"t": t, "ckpt": p, "op": "gone", "size": 0})
    return events


def sh(argv: list, timeout: float = 60.0) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable: {e}"


VERSIONS_PY = r"""
import json, platform, importlib.metadata as md
v = {"python": platform.python_version()}
for name in ("torch", "transformers", "accelerate", "triton", "specforge", "tqdm", "numpy"):
    try:
        v[name] = md.version(name)
    except Exception:
        pass
try:
    import torch
    v["torch"] = torch.__version__
    v["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
except Exception as e:
    v["torch_error"] = repr(e)
print(json.dumps(v))
"""


def environment(python: str) -> dict:
    text = sh([python, "-c", VERSIONS_PY], timeout=120)
    try:
        versions = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        versions = {"error": text[-500:]}
    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    return {"versions": versions, "nvidia_smi": smi, "host_cpus": os.cpu_count(),
            "kernel": os.uname().release}


class Recorder:
    def __init__(self, plan: dict, out: str, deadline: float):
        self.plan, self.out, self.deadline = plan, out, deadline
        self.env_meta = environment(plan.get("python", sys.executable))
        self.results = []
        self.lock = threading.Lock()

    def run_one(self, run: dict, lane: str) -> None:
        name = run["name"]
        cwd = os.path.abspath(run.get("cwd", "."))
        os.makedirs(cwd, exist_ok=True)
        ck_root = os.path.join(cwd, run["ckpt_dir"]) if run.get("ckpt_dir") else None
        env = dict(os.environ)
        env.update(self.plan.get("env", {}))
        env.update(run.get("env", {}))
        env.update({"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
        remaining = self.deadline - time.time()
        timeout = min(float(run.get("timeout", 300)), remaining - 20)
        if timeout < float(run.get("min_time", 30)):
            return self._result(name, lane, {"skipped": f"only {remaining:.0f}s left before the deadline"})
        before = scan(ck_root, cwd) if ck_root else {}
        meta = {k: run[k] for k in ("trainer", "profile", "resume", "tokens_per_step", "notes", "phase")
                if k in run}
        meta.update({"command": run["cmd"], "cwd": cwd,
                     "profile_env": run.get("env", {}), "common_env": self.plan.get("env", {}),
                     "checkpoint_dir": run.get("ckpt_dir"), "lane": lane,
                     "side_by_side": self.plan.get("side_by_side", ""),
                     "ckpt_at_start": [{"path": p, "size": s} for p, (s, _m) in sorted(before.items())],
                     "timeout_s": round(timeout, 1), "poll_s": POLL_S})
        meta.update(self.env_meta)
        header = {"trace": 1, "name": name, "job": None,
                  "recorded_by": "bench/traces/record_traces.py (h-device)", "meta": meta}
        w = TraceWriter(os.path.join(self.out, name + ".jsonl.gz"), header)
        t0 = time.time()
        w.add({"t": t0, "run": {"profile": run.get("profile", "default"),
                                "phase": run.get("phase", "train"), "resume": bool(run.get("resume"))}})
        proc = subprocess.Popen(run["cmd"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        reader = threading.Thread(target=self._read, args=(proc, w), daemon=True)
        reader.start()
        snap, aborted, killed = before, None, False
        while True:
            rc = proc.poll()
            now = time.time()
            if ck_root:
                cur = scan(ck_root, cwd)
                for ev in diff(snap, cur, now):
                    w.add(ev)
                snap = cur
            if rc is not None:
                break
            if aborted is None and now - t0 > timeout:
                aborted = now
                proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
            elif aborted is not None and not killed and now - aborted > 15:
                proc.kill()
                killed = True
            time.sleep(POLL_S)
        reader.join(20)
        t_end = time.time()
        if ck_root:  # files written in the last moments
            for ev in diff(snap, scan(ck_root, cwd), t_end):
                w.add(ev)
        w.add({"t": t_end, "exit": rc})
        w.close()
        return self._result(name, lane,
                            {"start": t0, "end": t_end, "exit": rc, "wall_s": round(t_end - t0, 2),
                                  "timed_out": aborted is not None, "sigabrt_at": aborted,
                                  "killed": killed, "records": w.count})

    @staticmethod
    def _read(proc, w: TraceWriter) -> None:
        split = Splitter()
        fd = proc.stdout.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            t = time.time()
            if not data:
                break
            for line in split.feed(data):
                w.add({"t": t, "out": line})
        for line in split.close():
            w.add({"t": time.time(), "out": line})

    def _result(self, name: str, lane: str, res: dict) -> dict:
        res.update({"name": name, "lane": lane})
        with self.lock:
            self.results.append(res)
            print(f"[record] {json.dumps(res)}", flush=True)
            self._dump()
        return res

    def _dump(self) -> None:
        doc = {"environment": self.env_meta, "plan": self.plan, "runs": self.results}
        tmp = os.path.join(self.out, "runs.json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, os.path.join(self.out, "runs.json"))

    def lane(self, lane: str, runs: list) -> None:
        for run in runs:
            while run:
                try:
                    res = self.run_one(run, lane)
                except Exception as e:  # one broken run must not end the others
                    res = self._result(run.get("name", "?"), lane, {"error": repr(e)})
                # a run that failed may name a fallback (e.g. the same trainer without torch_compile)
                fb = run.get("fallback") if res.get("exit") not in (0, None) or "error" in res else None
                run = dict(run, **fb, fallback=None) if fb else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds from now: no run goes past it")
    ap.add_argument("--only", default="", help="comma-separated lane names to run")
    a = ap.parse_args(argv)
    with open(a.plan) as f:
        plan = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    rec = Recorder(plan, a.out, time.time() + a.deadline)
    lanes = {k: v for k, v in plan["lanes"].items() if not a.only or k in a.only.split(",")}
    threads = [threading.Thread(target=rec.lane, args=(k, v), name=k) for k, v in lanes.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec._dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
