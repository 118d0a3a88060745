"""The trace recorder (bench/traces/record_traces.py) running real trainer processes: its
driver's records, a hung run's SIGABRT and stacks, a failed run's fallback (the recorder's
pure parts and the recorded traces: tests/unit/test_record_traces.py)."""

from __future__ import annotations

import json
import sys

from bench.traces import record_traces as rt
from test_record_traces import KINDS, read

TRAINER = r"""
import os, sys, time
sys.stdout.write("start\n"); sys.stdout.flush()
sys.stdout.write("\r10 it/s\r20 it/s\n"); sys.stdout.flush()
os.makedirs("ck", exist_ok=True)
open("ck/a.pt", "wb").write(b"x" * 10)
time.sleep(0.7)
open("ck/a.pt", "ab").write(b"y" * 5)
time.sleep(0.7)
os.unlink("ck/a.pt")
time.sleep(0.7)
sys.stderr.write("to stderr\n")
sys.exit(3)
"""


def record(tmp_path, runs, deadline=60.0):
    plan = {"python": sys.executable, "env": {"X_COMMON": "1"}, "lanes": {"a": runs}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "traces"
    assert rt.main(["--plan", str(tmp_path / "plan.json"), "--out", str(out),
                    "--deadline", str(deadline)]) == 0
    return out


def test_driver_writes_v1_with_lines_checkpoint_events_and_exit(tmp_path):
    run = {"name": "fake", "trainer": "fake", "profile": "p1", "tokens_per_step": 7,
           "cmd": [sys.executable, "-c", TRAINER], "cwd": str(tmp_path / "w"), "ckpt_dir": "ck",
           "env": {"X_PROFILE": "1"}, "timeout": 30, "min_time": 1}
    out = record(tmp_path, [run])
    header, recs = read(out / "fake.jsonl.gz")
    assert header["trace"] == 1 and header["name"] == "fake" and header["job"] is None
    meta = header["meta"]
    assert meta["tokens_per_step"] == 7 and meta["command"] == run["cmd"]
    assert meta["profile_env"] == {"X_PROFILE": "1"} and meta["common_env"] == {"X_COMMON": "1"}
    assert "versions" in meta and "nvidia_smi" in meta
    assert recs[0]["run"] == {"profile": "p1", "phase": "train", "resume": False}
    assert recs[-1]["exit"] == 3
    for r in recs:
        assert sum(k in r for k in KINDS) == 1 and isinstance(r["t"], float)
    assert [r["t"] for r in recs] == sorted(r["t"] for r in recs)
    lines = [r["out"] for r in recs if "out" in r]
    assert lines == ["start", "", "10 it/s", "20 it/s", "to stderr"]
    ops = [(r["ckpt"], r["op"]) for r in recs if "ckpt" in r]
    assert ops == [("ck/a.pt", "new"), ("ck/a.pt", "changed"), ("ck/a.pt", "gone")]
    sizes = [r["size"] for r in recs if "ckpt" in r]
    assert sizes[:2] == [10, 15]
    result = json.loads((out / "runs.json").read_text())["runs"][0]
    assert result["exit"] == 3 and result["timed_out"] is False


def test_a_hung_run_gets_sigabrt_and_its_stacks_land_in_the_trace(tmp_path):
    hang = "import threading, time\nt = threading.Thread(target=time.sleep, args=(60,), name='w')\n" \
           "t.start(); print('up', flush=True); t.join()\n"
    run = {"name": "hang", "trainer": "fake", "cmd": [sys.executable, "-c", hang],
           "cwd": str(tmp_path / "w"), "timeout": 2, "min_time": 1}
    out = record(tmp_path, [run])
    _header, recs = read(out / "hang.jsonl.gz")
    text = [r["out"] for r in recs if "out" in r]
    assert "Fatal Python error: Aborted" in text
    assert sum(1 for x in text if x.startswith("Thread 0x") or x.startswith("Current thread")) >= 2
    assert recs[-1]["exit"] == -6
    assert json.loads((out / "runs.json").read_text())["runs"][0]["timed_out"] is True


def test_a_failed_run_runs_its_fallback(tmp_path):
    run = {"name": "first", "trainer": "fake", "cmd": [sys.executable, "-c", "raise SystemExit(2)"],
           "cwd": str(tmp_path / "w"), "timeout": 20, "min_time": 1,
           "fallback": {"name": "second", "cmd": [sys.executable, "-c", "print('ok')"]}}
    out = record(tmp_path, [run])
    names = [r["name"] for r in json.loads((out / "runs.json").read_text())["runs"]]
    assert names == ["first", "second"]
    assert read(out / "second.jsonl.gz")[1][-1]["exit"] == 0
