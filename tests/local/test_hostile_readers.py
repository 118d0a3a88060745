"""Issue 35 row 10: every reader of a trace, journal or JSON Lines file meets hostile files (a
gzip bomb, a line of hundreds of MiB, JSON nested 100k deep, fields of the wrong type) through
the installed CLI: one line (file:line, what was wrong), exit != 0 where the file is the
command's input, no traceback, and the peak RSS of that one child bounded (os.wait4 on its
pid: never RUSAGE_CHILDREN, which is the peak of every child pytest reaped). Never a time."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import zlib
from pathlib import Path

import pytest

from helpers import gpujob_argv, local_env

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "jobs" / "fleet-torch.yaml"
#: the CLI's peak RSS whatever the file holds (Python with rich and pydantic is ~60 MiB)
BOUND_KIB = 200 << 10
#: a safety net for the old code, which read whole files: it fails here, not the machine
AS_LIMIT = 3 << 30
HEAD = {"trace": 1, "meta": {"throughput": {"format": "ktok", "min": 80, "window": 5}}}


def run_measured(argv: list, env: dict | None = None, tmp: Path | None = None) -> tuple:
    """(exit code, stdout, stderr, peak RSS in KiB) of one gpujob child."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    out_path, err_path = (tmp or Path("/tmp")) / "out", (tmp or Path("/tmp")) / "err"
    with open(out_path, "wb") as so, open(err_path, "wb") as se:
        p = subprocess.Popen(gpujob_argv() + argv, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                             env=env or dict(os.environ, COLUMNS="200"), preexec_fn=limit)
        _pid, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return p.returncode, out_path.read_bytes(), err_path.read_bytes(), usage.ru_maxrss


def one_line(err: bytes) -> str:
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text and "Error:" not in text.split(":", 1)[0], text[-2000:]
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("  hint:")]
    assert len(lines) == 1, text[-2000:]
    return lines[0]


def gz_lines(path: Path, *lines) -> Path:
    with gzip.open(path, "wb") as f:
        for ln in lines:
            f.write(ln if isinstance(ln, bytes) else (json.dumps(ln) + "\n").encode())
    return path


def gz_stream(path: Path, head: bytes, body: bytes, times: int, tail: bytes = b"") -> Path:
    """A gzip file of ``head``, ``body`` ``times`` over, ``tail``: a bomb of any size, a few MiB on disk."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(times):
            f.write(c.compress(body))
        f.write(c.compress(tail) + c.flush())
    return path


def replay(path: Path, tmp: Path, *extra) -> tuple:
    return run_measured(["replay", str(path), *extra], tmp=tmp)


# ---- the size bounds: decompressed size, line length ------------------------------------
def test_a_gzip_bomb_of_newlines_stops_at_the_decompressed_bound(tmp_path):
    bomb = gz_stream(tmp_path / "bomb.jsonl.gz", (json.dumps(HEAD) + "\n").encode(), b"\n" * (1 << 24), 80)
    assert bomb.stat().st_size < 8 << 20
    rc, out, err, peak = replay(bomb, tmp_path)
    assert rc == 2 and "bomb.jsonl.gz: decompresses to more than 1024 MiB" in one_line(err), err[-500:]
    assert peak < BOUND_KIB, f"peak RSS {peak >> 10} MiB"


def test_a_one_gib_line_in_a_trace_is_refused_at_its_line_without_holding_it(tmp_path):
    big = gz_stream(tmp_path / "long.jsonl.gz", (json.dumps(HEAD) + "\n").encode() + b'{"t":1,"out":"',
                    b"a" * (1 << 24), 64, b'"}\n')
    rc, out, err, peak = replay(big, tmp_path)
    assert rc == 2 and "long.jsonl.gz:2: a line longer than" in one_line(err)
    assert peak < BOUND_KIB, f"peak RSS {peak >> 10} MiB"


def test_a_long_line_in_a_plain_samples_file(tmp_path):
    p = tmp_path / "samples.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"t":1,"value":5}\n{"t":2,"value":"')
        block = b"7" * (1 << 20)
        for _ in range(256):
            f.write(block)
        f.write(b'"}\n')
    rc, out, err, peak = replay(p, tmp_path, "--spec", str(SPEC))
    assert rc == 2 and "samples.jsonl:2: a line longer than" in one_line(err)
    assert peak < BOUND_KIB, f"peak RSS {peak >> 10} MiB"


# ---- nesting ----------------------------------------------------------------------------------
@pytest.mark.parametrize("body", [b"[" * 100000 + b"]" * 100000, b'{"a":' * 100000 + b"1" + b"}" * 100000,
                                  b'{"t":1,"out":"x","x":' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_deeply_nested_json_in_a_trace(tmp_path, body):
    p = gz_lines(tmp_path / "deep.jsonl.gz", HEAD, body + b"\n", {"t": 2, "out": "x"})
    rc, out, err, peak = replay(p, tmp_path)
    assert rc == 2 and "deep.jsonl.gz:2: nested deeper than 64 levels" in one_line(err)


def test_deeply_nested_json_in_a_samples_file(tmp_path):
    p = tmp_path / "samples.jsonl"
    p.write_bytes(b'{"t":1,"value":5}\n' + b"[" * 100000 + b"]" * 100000 + b"\n")
    rc, out, err, peak = replay(p, tmp_path, "--spec", str(SPEC))
    assert rc == 2 and "samples.jsonl:2: nested deeper than 64 levels" in one_line(err)


# ---- types of fields --------------------------------------------------------------------------
RUN = {"t": 1, "run": {"profile": "p"}}


@pytest.mark.parametrize("lines, expect", [
    ([HEAD, {"t": 1, "run": "x"}], ":2: field run: expected an object or null, got a string"),
    ([HEAD, RUN, {"t": 2, "recorded": [1]}], ":3: field recorded: expected an object or null, got a list"),
    ([{"trace": 1, "meta": [1]}, RUN], ":1: field meta: expected an object or null, got a list"),
    ([{"trace": 1, "meta": {"throughput": "fast"}}, RUN], ":1: field meta.throughput: expected an object"),
    ([HEAD, RUN, {"t": 2, "ckpt": "c", "size": "big"}],
     ":3: field size: expected a number or null, got a string"),
    ([HEAD, RUN, b'{"t":NaN,"out":"x"}\n'], ":3: field t: expected a number, got nan"),
    ([HEAD, RUN, {"t": "soon", "out": "x"}], ":3: field t: expected a number, got a string"),
    ([HEAD, RUN, {"t": 2, "out": 5}], ":3: field out: expected a string, got a number"),
    ([HEAD, {"t": 1, "run": {"baseline": "high"}}], ":2: field run.baseline: expected a number or null"),
    ([HEAD, {"t": 1, "run": {"profile": ["a"]}}], ":2: field run.profile: expected a string or null"),
    ([HEAD, RUN, {"t": 2, "recorded": {"verdict": 3}}], ":3: field recorded.verdict: expected a string"),
    ([HEAD, RUN, [1, 2]], ":3: expected a JSON object, got a list"),
    ([{"trace": 1, "meta": {"throughput": {"format": "ktok", "window": "abc"}}}, RUN],
     ":1: field meta.throughput.window: "),
    ([{"trace": 1, "meta": {"throughput": {"format": "ktok", "min": [80]}}}, RUN],
     ":1: field meta.throughput.min"),
])
def test_a_trace_field_of_the_wrong_type_is_named_with_its_line(tmp_path, lines, expect):
    p = gz_lines(tmp_path / "t.jsonl.gz", *lines, {"t": 9, "out": "last"})
    rc, out, err, peak = replay(p, tmp_path)
    assert rc == 2 and f"t.jsonl.gz{expect}" in one_line(err), err.decode()


@pytest.mark.parametrize("text, expect", [
    (b'{"t":1,"value":2,"step":"x"}\n', ":1: field step: expected a number or null, got a string"),
    (b'{"t":1,"value":[2]}\n', ":1: field value: expected a number or null, got a list"),
    (b'{"t":1,"value":2,"profile":{"a":1}}\n', ":1: field profile: expected a string or null, got an object"),
    (b'{"t":1,"value":2}\n{"t":true,"value":3}\n', ":2: field t: expected a number, got a boolean"),
])
def test_a_samples_field_of_the_wrong_type(tmp_path, text, expect):
    p = tmp_path / "s.jsonl"
    p.write_bytes(text + b'{"t":9,"value":1}\n')
    rc, out, err, peak = replay(p, tmp_path, "--spec", str(SPEC))
    assert rc == 2 and f"s.jsonl{expect}" in one_line(err), err.decode()


def test_what_is_tolerated_stays_tolerated(tmp_path):
    """A torn last record (a writer that died) and a trimmed journal's NUL hole read as before."""
    p = tmp_path / "s.jsonl"
    p.write_bytes(b"\0" * (8 << 20) + b"".join(b'{"t":%d,"value":9000000}\n' % i for i in range(50))
                  + b'{"t":60,"va')
    rc, out, err, peak = replay(p, tmp_path, "--spec", str(SPEC), "--json")
    assert rc == 0, err.decode()
    assert json.loads(out.splitlines()[-1])["summary"]["per_segment"][0]["samples"] == 50
    data = gzip.compress((json.dumps(HEAD) + "\n" + "".join(
        json.dumps({"t": 100 + i, "out": f"{30 + i % 3} ktok/s"}) + "\n" for i in range(40))).encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[:-9])  # the last block's end (a supervisor killed mid-flush)
    rc, out, err, peak = replay(cut, tmp_path)
    assert rc == 0 and b"segment(s)" in out, err.decode()


# ---- the other readers: logs --events (plain and --json), --stacks, status ----------------
def make_job(root: Path, events: bytes) -> None:
    j = root / "jobs" / "j1"
    j.mkdir(parents=True)
    (j / "job.json").write_text(json.dumps({"format": 1, "job_id": "j1", "spec": {"name": "x"}}))
    (j / "state.json").write_text(json.dumps({"format": 1, "state": "finished", "name": "x", "job_id": "j1"}))
    (j / "events.jsonl").write_bytes(events)


def hostile_events(tmp_path: Path) -> bytes:
    with open(tmp_path / "ev", "wb") as f:
        f.write(b'{"t":1,"type":"first"}\n' + b"[" * 100000 + b"]" * 100000 + b"\n")
        f.write(b'{"t":"soon","type":"sample","value":"x"}\n{"t":2,"type":"sample","value":[1]}\n')
        f.write(b'{"t":3,"type":"stacks","stacks":[1,{"pid":4,"argv":"ab","text":"s"}]}\n{"t":4,"type":"x","n":"')
        block = b"9" * (1 << 20)
        for _ in range(160):
            f.write(block)
        f.write(b'"}\n{"t":5,"type":"last"}\n')
    return (tmp_path / "ev").read_bytes()


@pytest.mark.parametrize("args", [["--events"], ["--events", "--json"], ["--stacks"]])
def test_logs_of_a_hostile_events_file(tmp_path, args):
    env = local_env(tmp_path)
    make_job(tmp_path / "root", hostile_events(tmp_path))
    rc, out, err, peak = run_measured(["logs", "j1", "-t", "box", *args], env, tmp_path)
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text and rc == 0, text[-2000:]
    assert peak < BOUND_KIB, f"peak RSS {peak >> 10} MiB"
    if args == ["--stacks"]:
        assert b"-- pid 4: \ns\n" in out  # the stack that is no object passed over, argv not a list
        return
    said = [ln for ln in text.splitlines() if ln.strip()]
    assert all(ln.startswith("gpujob: skipped a damaged record in events.jsonl") for ln in said), said
    if "--json" in args:
        recs = [json.loads(x) for x in out.splitlines()]
        assert [r["t"] for r in recs] == [1, "soon", 2, 3, 5] and len(said) == 2  # deep, long
    else:
        assert b"first" in out and b"last" in out and len(said) == 4  # deep, two samples, long


@pytest.mark.parametrize("case", ["deep", "long", "types"])
def test_replay_of_a_job_whose_trace_is_hostile(tmp_path, case):
    """``gpujob replay JOB``: the trace fetched from the container is read by the same reader."""
    env = local_env(tmp_path)
    make_job(tmp_path / "root", b"")
    j = tmp_path / "root" / "jobs" / "j1"
    (j / "job.json").write_text(json.dumps({"format": 1, "job_id": "j1", "spec": {
        "name": "x", "throughput": {"format": "ktok", "min": 10, "window": 3}}}))
    if case == "deep":
        gz_lines(j / "trace.jsonl.gz", HEAD, b"[" * 100000 + b"]" * 100000 + b"\n")
    elif case == "long":
        gz_stream(j / "trace.jsonl.gz", (json.dumps(HEAD) + "\n").encode(), b"z" * (1 << 24), 64)
    else:
        gz_lines(j / "trace.jsonl.gz", HEAD, RUN, {"t": 2, "ckpt": ["c"]})
    rc, out, err, peak = run_measured(["replay", "j1", "-t", "box"], env, tmp_path)
    expect = {"deep": ":2: nested deeper than 64 levels", "long": ":2: a line longer than",
              "types": ":3: field ckpt: expected a string, got a list"}[case]
    assert rc == 2 and f"job j1's trace.jsonl.gz{expect}" in one_line(err), err.decode()[-2000:]
    assert peak < BOUND_KIB, f"peak RSS {peak >> 10} MiB"
