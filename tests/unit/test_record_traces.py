"""The trace recorder (bench/traces/record_traces.py) and the traces it recorded on the H200."""

import glob
import gzip
import json
import os

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
            assert (meta["profile_env"].get("TORCHDYNAMO_DISABLE") == "1") == \
                (meta["profile"] == "broken_compile")
            assert any("ckpt" in r for r in recs), path


def test_a_supervisor_trace_kept_in_the_repo_is_a_whole_gzip_stream():
    """A live supervisor trace has no gzip end (it is flushed, not closed); one copied into
    tests/data must be finished, so that any gzip reader takes it."""
    assert SUPERVISOR_TRACES
    for path in SUPERVISOR_TRACES:
        header, recs = read(path)
        assert header["trace"] == 1 and header["recorded_by"] == "gpujob supervisor", path
        assert "exit" in recs[-1], path
