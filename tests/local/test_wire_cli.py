"""Each refusal code of the agent (agent/base/wire.py Code) reaches the user of the installed
`gpujob` (local kind, the kept connection on) as its mapped exit code (ops/target.py REFUSALS)
with one clear line, and with --json as one error object that names the code."""

from __future__ import annotations

import json
import os

import pytest

from gpujob.agent.base.fsio import write_json
from gpujob.agent.home.journal import Home
from gpujob.agent.home.lock import Lock
from helpers import cli, local_env


@pytest.fixture
def box(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    env = local_env(tmp_path, root)

    def job(job_id: str, state: dict) -> None:
        d = Home(str(root)).job_dir(job_id)
        os.makedirs(d)
        spec = {"name": "wj", "profiles": [{"name": "a"}, {"name": "b"}]}
        write_json(os.path.join(d, "job.json"), {"spec": spec, "profile": "a"})
        write_json(os.path.join(d, "state.json"), dict({"profile": "a"}, **state))
    yield root, env, job
    cli(["disconnect"], env)


def refused(args: list, env: dict, exit_code: int, code: str, text: str) -> None:
    p = cli(args, env)
    err = p.stderr.decode()
    assert p.returncode == exit_code, (args, p.returncode, err)
    assert err.count("\n") == 1 and err.startswith("gpujob: ") and text in err, (args, err)
    assert "Traceback" not in err and p.stdout == b""
    p = cli([*args, "--json"], env)
    assert p.returncode == exit_code, (args, p.stderr)
    got = json.loads(p.stderr.decode())
    assert got["code"] == exit_code and got["refused"] == code and text in got["error"], got


def test_each_refusal_code_reaches_the_user_as_its_exit_code(box):
    root, env, job = box
    job("wj-old1", {"state": "stopped"})
    job("wj-new1", {"state": "training", "format": 99, "supervisor_pid": 999999})
    refused(["status", "nosuch-1", "-t", "box"], env, 5, "unknown_job", "no job nosuch-1 in this container")
    refused(["status", "wj-new1", "-t", "box"], env, 5, "newer_format", "newer than this agent's")
    refused(["logs", "nosuch-1", "-t", "box"], env, 5, "unknown_job", "no job nosuch-1 in this container")
    refused(["rollback", "wj-old1", "-t", "box", "--to", "zz"], env, 2, "bad_request",
            "no profile 'zz' in job wj-old1; profiles: a, b")
    refused(["rollback", "wj-old1", "-t", "box", "--to", "a"], env, 5, "conflict",
            "job wj-old1 already runs on profile a")
    refused(["ledger", "undo", "box", "wj", "9"], env, 5, "not_found", "no verdict '9' in the ledger of wj")
    os.makedirs(root / "ledger", exist_ok=True)
    (root / "ledger" / "wd.json").write_text("{not json")
    refused(["ledger", "history", "box", "wd"], env, 5, "damaged", "ledger recover")
    held = Lock(str(root)).try_acquire("wj-other", by="bob@elsewhere")
    assert held is not None
    try:  # an ended job restarted on another profile needs the container's lock
        refused(["rollback", "wj-old1", "-t", "box", "--to", "b"], env, 5, "busy",
                "container busy: job wj-other of bob@elsewhere")
    finally:
        held.release()
    with open(os.path.join(Home(str(root)).job_dir("wj-old1"), "state.json")) as f:
        assert json.load(f)["state"] == "stopped"  # refused: nothing changed there
