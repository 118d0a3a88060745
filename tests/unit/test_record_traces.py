"""The trace recorder (bench/traces/record_traces.py) and the traces it recorded on the H200."""

import glob
import gzip
import json
import os
import sys

from bench.traces import record_traces as rt

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
# the recorder's traces; a supervisor's own trace (gpujob_*.jsonl.gz, with its decisions) is
# checked by tests/unit/test_real_traces.py
TRACES = sorted(p for p in glob.glob(os.path.join(HERE, "data", "traces", "*.jsonl.gz"))
                if not os.path.basename(p).startswith("gpujob_"))
SUPERVISOR_TRACES = sorted(glob.glob(os.path.join(HERE, "data", "traces", "gpujob_*.jsonl.gz")))
KINDS = ("run", "out", "ckpt", "exit", "recorded")


def read(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    return recs[0], recs[1:]


def test_splitter_splits_on_lf_cr_and_crlf_once():
    s = rt.Splitter()
    assert s.feed(b"a\rb\r") == ["a", "b"]
    assert s.feed(b"\nc\n") == ["c"]  # the \r\n split across chunks ends one line, not two
    assert s.feed(b"x\r\n\r\ny") == ["x", ""]
    assert s.close() == ["y"]
    assert s.feed("é\n".encode()) == ["é"]


def test_diff_names_new_changed_and_gone():
    old = {"ck/a": (1, 10), "ck/b": (2, 10)}
    new = {"ck/a": (5, 11), "ck/c": (3, 12)}
    ops = {(e["ckpt"], e["op"], e["size"]) for e in rt.diff(old, new, 1.0)}
    assert ops == {("ck/a", "changed", 5), ("ck/c", "new", 3), ("ck/b", "gone", 0)}


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


def test_recorded_traces_are_v1_and_small():
    assert len(TRACES) >= 20
    for path in TRACES:
        assert os.path.getsize(path) < 1024 * 1024, path
        header, recs = read(path)
        assert header["trace"] == 1 and header["name"] == os.path.basename(path)[:-len(".jsonl.gz")]
        meta = header["meta"]
        assert meta["versions"]["torch"] == "2.11.0+cu130" and meta["nvidia_smi"].startswith("NVIDIA H200")
        assert "run" in recs[0] and "exit" in recs[-1], path
        for r in recs:
            assert sum(k in r for k in KINDS) == 1, (path, r)
        assert [r["t"] for r in recs] == sorted(r["t"] for r in recs), path
        if meta["trainer"] != "compile_race":
            assert meta["tokens_per_step"] > 0
            assert meta["profile"] in ("compiled", "broken_compile")
            assert (meta["profile_env"].get("TORCHDYNAMO_DISABLE") == "1") == (meta["profile"] == "broken_compile")
            assert any("ckpt" in r for r in recs), path


def test_a_supervisor_trace_kept_in_the_repo_is_a_whole_gzip_stream():
    """A live supervisor trace has no gzip end (it is flushed, not closed); one copied into
    tests/data must be finished, so that any gzip reader takes it."""
    assert SUPERVISOR_TRACES
    for path in SUPERVISOR_TRACES:
        header, recs = read(path)
        assert header["trace"] == 1 and header["recorded_by"] == "gpujob supervisor", path
        assert "exit" in recs[-1], path
