"""Bugs that mypy over the agent (check_untyped_defs, Python 3.9; scripts/mypy-agent) showed: each
test fails on the code before the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpujob.agent.base.defaults import DEFAULTS
from gpujob.agent.judge import decide
from gpujob.agent.judge.decide import Do


def _out(signal: str) -> SimpleNamespace:
    return SimpleNamespace(kind="signal", signal_name=signal, reason="it ended", evidence={}, to=None,
                           request=None, mark_bad=True, exit_code=1, at=100.0)


def test_next_action_without_default_restarts_takes_the_specs_defaults():
    """``default_restarts`` may be left out (None): a restart the job's own policy does not name
    (a container restart, a compile race) is then judged by the spec's defaults, as the supervisor
    passes them, not by ``None["max"]`` (a TypeError)."""
    rb = dict(DEFAULTS["rollback"], fallback=[], on=[])
    for signal in ("container_restart", "compile_race"):
        args = (_out(signal), "fast", {"profiles": {}}, {"fast": {}}, rb, {"on": []}, [], [], None, 1000.0)
        assert decide.next_action(*args) == decide.next_action(*args, DEFAULTS["restarts"])
        assert decide.next_action(*args).do == Do.RESTART


def _job_dir(root, job_id: str):
    """A submitted job's folder as submit leaves it (job.json, state.json), no supervisor started."""
    from gpujob.agent.base import protocol
    from gpujob.agent.base.fsio import write_json
    from gpujob.agent.home.journal import Home, Journal
    from gpujob.ops.plan import job_request
    from gpujob.spec.model import load_spec
    (root / "spec").mkdir()
    (root / "spec" / "job.yaml").write_text(
        "name: tj\nprofiles:\n  - {name: fast, index_url: \"https://i/simple\", packages: [\"a==1\"]}\n"
        "train: {command: python t.py}\n")
    req = job_request(load_spec(root / "spec" / "job.yaml"), job_id, "fast", clear_caches=False)
    j = Journal(Home(str(root / "home")), job_id)
    os.makedirs(j.dir)
    write_json(j.path("job.json"), dict(req.job_record(), **{protocol.FORMAT_KEY: protocol.FORMAT}))
    j.set_state(job_id=job_id, name="tj", state="preparing", phase="start", profile="fast")
    return j


def test_a_supervisor_that_cannot_open_job_log_still_writes_the_job_failed(tmp_path):
    """job.log not openable (here a directory): the supervisor's banner had nowhere to go, and its
    AttributeError on the missing log was swallowed before the FAILED state was written, so the
    job kept looking alive with no supervisor. The state says why now."""
    j = _job_dir(tmp_path, "tj-1")
    os.makedirs(j.path("job.log"))
    code = ("import sys\nfrom gpujob.agent.supervisor.supervisor import run\n"
            "run(sys.argv[1], 'tj-1')\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "home")], capture_output=True, text=True,
                       timeout=120, cwd=str(Path(__file__).parents[2]))
    assert p.returncode != 0 and "IsADirectoryError" in p.stderr, p.stderr  # the real error, raised
    st = j.state()
    assert st["state"] == "failed", st
    assert "IsADirectoryError" in st["reason"] and "job.log" in st["reason"], st["reason"]


def test_a_supervisor_handed_a_lock_without_its_generation_refuses_before_touching_the_job(tmp_path):
    """``run --lock-fd`` without ``--generation`` held a lock that fenced nothing (generation None:
    an older supervisor's writes were no longer refused); now it is refused, and nothing is written."""
    from gpujob.agent.supervisor.supervisor import run
    j = _job_dir(tmp_path, "tj-2")
    with open(j.path("state.json")) as f:
        before = sorted(os.listdir(j.dir)), f.read()
    fd = os.open(str(tmp_path / "lockfile"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with pytest.raises(ValueError, match="--lock-fd and --generation"):
            run(str(tmp_path / "home"), "tj-2", lock_fd=fd)
        with pytest.raises(ValueError, match="--lock-fd and --generation"):
            run(str(tmp_path / "home"), "tj-2", generation=3)
        os.fstat(fd)  # still ours: not released by a half-started supervisor
    finally:
        os.close(fd)
    with open(j.path("state.json")) as f:
        assert (sorted(os.listdir(j.dir)), f.read()) == before


def test_mypy_checks_the_agent_and_scripts_test_runs_it_at_python_3_9():
    """The agent's errors are not ignored (pyproject's [tool.mypy]), its untyped functions are
    checked, and both test commands run the 3.9 check (scripts/mypy-agent)."""
    import configparser
    import tomllib
    root = Path(__file__).parents[2]
    mypy = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mypy"]
    assert not any(o.get("ignore_errors") for o in mypy.get("overrides", []))
    agent = [o for o in mypy["overrides"] if "gpujob.agent.*" in o["module"]]
    assert agent and all(o.get("check_untyped_defs") for o in agent)
    ini = configparser.ConfigParser()
    ini.read(root / "scripts" / "mypy-agent.ini")
    assert (ini["mypy"]["files"], ini["mypy"]["python_version"], ini["mypy"]["check_untyped_defs"]) == \
        ("gpujob/agent", "3.9", "True")
    script = (root / "scripts" / "test").read_text()
    fast, full = script.split('\nfi\n', 1)[0].split('"--fast" ]', 1)[1], script.split('\nfi\n', 1)[1]
    assert "scripts/mypy-agent" in fast and "scripts/mypy-agent" in full
