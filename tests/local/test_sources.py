"""Throughput from a JSONL metrics file (throughput.source: file): the parsing, the
spec, and a job whose trainer prints nothing, rolled back on its file's tok/s."""

from __future__ import annotations

import json
import textwrap

import pytest

from gpujob.agent.supervisor.filesource import FileSource
from gpujob.agent.judge.sources import field_value, parse_record
from helpers import cli, events, job_id_of, local_env, write_spec
from test_faults import jdir, state_of, wheelhouse  # noqa: F401  (fixture)

QUIET = textwrap.dedent('''
    import json, os, sys, time
    import demo_kernels
    step = int(open("ckpt").read()) if "--resume" in sys.argv and os.path.exists("ckpt") else 0
    with open("metrics.jsonl", "a") as m:
        for _ in range(int(sys.argv[1])):
            time.sleep(0.05)
            step += 1
            m.write(json.dumps({"step": step, "perf": {"tokens_per_sec": demo_kernels.TOKENS_PER_SECOND}})
                    + "\\n")
            m.flush()
            open("ckpt", "w").write(str(step))
''')


def test_records_are_read_by_field_whole_lines_only(tmp_path):
    assert field_value({"perf": {"tps": 12.5}}, "perf.tps") == 12.5
    assert field_value({"tps": True}, "tps") is None and field_value({"tps": float("nan")}, "tps") is None
    assert parse_record(b'{"tps": 3, "step": 7}', "tps", "step") == (3.0, 7)
    assert parse_record(b"not json", "tps", None) is None
    f = tmp_path / "m.jsonl"
    f.write_bytes(b'{"tps": 1}\n')
    src = FileSource(str(f), "tps", None, scale=2.0)  # what was there before the run is not this run's
    assert src.poll() == []
    with open(f, "ab") as out:
        out.write(b'{"tps": 5}\n{"tps": "x"}\n{"tps": 6')  # the last record is still being written
    assert src.poll() == [(10.0, None)]
    with open(f, "ab") as out:
        out.write(b'}\n')
    assert src.poll() == [(12.0, None)] and src.position() == f.stat().st_size
    f.write_bytes(b'{"tps": 9}\n')  # the trainer started the file afresh
    assert src.poll() == [(18.0, None)]


@pytest.mark.parametrize("tp,message", [
    ({"source": "file", "field": "tps", "min": 1}, "throughput.path: missing (required) for source file"),
    ({"source": "file", "path": "m.jsonl", "field": "tps", "format": "ktok", "min": 1},
     "throughput.format: only for source stdout"),
    ({"path": "m.jsonl", "format": "ktok", "min": 1}, "throughput.path: only for source file"),
    ({"min": 1}, "throughput.format: missing (required) for source stdout"),
])
def test_spec_of_a_file_source(tmp_path, tp, message):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url="file:///x", slow_url="file:///y",
                      throughput=tp)
    p = cli(["submit", str(spec), "--plan"], local_env(tmp_path))
    assert p.returncode == 2 and message in p.stderr.decode(), p.stderr.decode()


def test_a_trainer_that_prints_nothing_is_rolled_back_on_its_metrics_file(tmp_path, wheelhouse):  # noqa: F811
    code = tmp_path / "code"
    code.mkdir()
    (code / "t.py").write_text(QUIET)
    urls = wheelhouse[1]
    tp = {"source": "file", "path": "metrics.jsonl", "field": "perf.tokens_per_sec", "step_field": "step",
          "window": 3, "min": "10K", "failure_limit": 2, "good_after": "1s", "no_data_timeout": "30s"}
    env = local_env(tmp_path)
    for name, profile, steps in (("a.yaml", "fast", 40), ("b.yaml", "slow", 60)):
        spec = write_spec(tmp_path / name, target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                          profile=profile, warmup=False, sync=[{"src": str(code), "dest": "."}],
                          train={"command": f"python t.py {steps}", "resume_args": ["--resume"],
                                 "grace": "2s"},
                          throughput=tp)
        p = cli(["submit", str(spec), "--follow"], env, timeout=120)
        assert p.returncode == 0, p.stdout.decode()[-2000:]
        job = job_id_of(p.stdout)
    st = state_of(tmp_path, job)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    [rb] = st["rollbacks"]
    assert (rb["from"], rb["to"], rb["signal"]) == ("slow", "fast", "low_throughput")
    assert not (jdir(tmp_path, job) / "train.log").read_text().strip()  # it printed nothing
    samples = [json.loads(ln) for ln in (jdir(tmp_path, job) / "samples.jsonl").read_text().splitlines()]
    assert {s["profile"] for s in samples} == {"slow", "fast"} and samples[0]["step"] is not None
    assert [e["type"] for e in events(jdir(tmp_path, job))].count("rollback") == 1
