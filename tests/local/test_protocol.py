"""The protocol both sides share (gpujob/agent/base/protocol.py): enums that stay plain
JSON strings, the agent's exit codes and one-line errors, the tail's first record,
the launcher's 'agent missing', and the format version of state.json and job.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpujob.agent.base import protocol
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.base.fsio import write_json
from gpujob.agent.base.protocol import ENDED, JobState, OffsetSplitter, Verdict
from gpujob.ops.target import agent_zip


def agent(home, *args, input=None):
    return subprocess.run([sys.executable, "-m", "gpujob.agent.main", "--home", str(home), *args],
                          capture_output=True, input=input, timeout=60)


def one_error(p) -> str:
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 1 and not p.stderr, (p.stdout, p.stderr)
    return json.loads(lines[0])["error"]


def test_states_are_their_json_strings():
    assert json.dumps({"s": JobState.ROLLING_BACK}) == '{"s": "rolling_back"}'
    assert f"{JobState.LOST}" == "lost" and str(Verdict.STALL) == "stall"
    assert "lost" in ENDED and "lost" in set(ENDED) and {JobState.FAILED: 1}["failed"] == 1
    assert [s for s in JobState if s.is_terminal()] == [JobState.STOPPED, JobState.SUCCEEDED, JobState.FAILED]
    assert not JobState.LOST.is_terminal() and JobState.LOST.has_ended()
    assert JobState.of("training") is JobState.TRAINING and JobState.of("from-the-future") is None


def test_offset_record_first_then_raw_bytes_in_any_chunking():
    data = protocol.offset_record(1234, 34) + b"line 1\nline 2\n"
    for size in (1, 3, 7, len(data)):
        got, recs = [], []
        split = OffsetSplitter(got.append, recs.append)
        for i in range(0, len(data), size):
            split(data[i:i + size])
        assert recs == [{"offset": 1234, "skipped": 34}] and b"".join(got) == b"line 1\nline 2\n"
    got = []
    split = OffsetSplitter(got.append, got.append)
    split(b'{"error": "no such job x", "refused": true}\n')
    assert split.error == "no such job x" and got == []


def test_bad_usage_and_unexpected_errors_are_one_json_line(tmp_path):
    p = agent(tmp_path, "no-such-command")
    assert p.returncode == protocol.USAGE and "invalid choice" in one_error(p)
    d = Home(str(tmp_path)).job_dir("j")
    os.makedirs(d)
    with open(os.path.join(d, "job.json"), "w") as f:
        f.write("[1, 2]")  # valid JSON of the wrong shape: an AttributeError deep inside
    with open(os.path.join(d, "state.json"), "w") as f:
        f.write("[]")
    p = agent(tmp_path, "status", "j", "--no-revive")
    assert p.returncode == protocol.FAILED and one_error(p)


def _job(tmp_path, state: dict) -> str:
    d = Home(str(tmp_path)).job_dir("j")
    os.makedirs(d)
    write_json(os.path.join(d, "job.json"), {"spec": {"name": "x"}})
    write_json(os.path.join(d, "state.json"), state)
    return d


def test_an_older_agent_refuses_newer_state_in_one_line_and_touches_nothing(tmp_path):
    d = _job(tmp_path, {"state": "training", "format": protocol.FORMAT + 1, "supervisor_pid": 999999})
    before = open(os.path.join(d, "state.json"), "rb").read()
    for args in (["status", "j"], ["stop", "j", "--wait", "1"], ["tail", "j"]):
        p = agent(tmp_path, *args)
        assert p.returncode == protocol.REFUSED, (args, p.stdout)
        assert "newer than this agent's" in one_error(p)
    assert open(os.path.join(d, "state.json"), "rb").read() == before
    assert not os.path.exists(os.path.join(d, "control"))


def test_a_newer_agent_adopts_older_state_without_a_version(tmp_path):
    d = _job(tmp_path, {"state": "training", "supervisor_pid": 999999, "child_pgid": 999998})  # format 1
    p = agent(tmp_path, "stop", "j", "--wait", "5")
    assert p.returncode == 0, p.stdout
    st = json.load(open(os.path.join(d, "state.json")))
    assert st["state"] == "stopped" and st["format"] == protocol.FORMAT
    assert Journal(Home(str(tmp_path)), "j").state()["state"] == JobState.STOPPED


def test_the_launcher_says_agent_missing_by_its_exit_code(tmp_path):
    missing = tmp_path / "bin" / "agent-x.pyz"
    argv = [sys.executable, "-c", protocol.LAUNCHER, str(missing), "--home", str(tmp_path), "probe"]
    p = subprocess.run(argv, capture_output=True, timeout=60)
    assert p.returncode == protocol.AGENT_MISSING and p.stdout == b"" and p.stderr == b""
    missing.parent.mkdir()
    missing.write_bytes(agent_zip()[0])
    p = subprocess.run(argv, capture_output=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["home"] == str(tmp_path)
    shadow = tmp_path / "cwd"  # modules in the directory it runs in shadow none of the agent's
    shadow.mkdir()
    for mod in ("runpy", "json", "argparse", "platform"):
        (shadow / f"{mod}.py").write_text("raise SystemExit(99)\n")
    p = subprocess.run(argv, capture_output=True, timeout=60, cwd=shadow)
    assert p.returncode == 0 and json.loads(p.stdout)["home"] == str(tmp_path), p.stderr


def test_failure_signals_are_the_names_the_spec_accepts_and_the_agent_reports():
    from typing import get_args

    import pytest

    from gpujob.agent.judge import signals
    from gpujob.ops.doctor import Check, CheckStatus
    from gpujob.spec.types import Signal
    assert list(get_args(Signal)) == [s.value for s in protocol.FailureSignal]
    name, _ = signals.classify_exit(-9, None, ["killed"], [])
    assert name is protocol.FailureSignal.OOM_KILLED and json.dumps(name) == '"oom_killed"'
    assert signals.scan_line("CUDA out of memory", []) is protocol.FailureSignal.CUDA_OOM
    assert Check("x", "warn", "d").status is CheckStatus.WARN
    assert Check("x", CheckStatus.FAIL, "d").as_dict()["status"] == "fail"
    with pytest.raises(ValueError):
        Check("x", "fine", "d")
