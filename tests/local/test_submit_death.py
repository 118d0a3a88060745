"""Issue 34 row 2, its death half: the controller SIGKILLed between reserving the job's row
in this laptop's index and recording the agent's answer. Killed before the container had
the job: the next `ps` says it was never started and forgets it (no phantom `not_found`
row in ps, nor in what Tab completes from). Killed after the agent started it: the job is
real, and `ps` shows it running on. Through the installed entry point on the local kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import cli, local_env


def spec(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "j.yaml").write_text(yaml.safe_dump({
        "name": "j", "target": "lab/box", "profiles": [{"name": "base", "system_site_packages": True}],
        "train": {"command": "python3 -c 'import time; time.sleep(120)'"}}))
    return where / "j.yaml"


def tab_jobs(env: dict) -> list:
    """The job ids Tab completion offers (gpujob/complete.py reads the index itself)."""
    p = subprocess.run([sys.executable, "-c", "from gpujob.complete import job_ids; print(job_ids())"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return eval(p.stdout)


def killed_submit(tmp_path: Path, point: str) -> tuple[dict, str]:
    env = local_env(tmp_path)
    died = tmp_path / "died"
    p = cli(["submit", str(spec(tmp_path / "r"))], dict(env, GPUJOB_TEST_DIE_AT=f"{point}@{died}"))
    assert p.returncode == -9 and died.exists(), (p.returncode, p.stderr.decode())
    ids = index_jobs(tmp_path)
    assert len(ids) == 1, ids
    return env, ids[0]


def index_jobs(tmp_path: Path) -> list:
    """The job ids in this laptop's index (state.db), phantoms included."""
    import sqlite3
    db = sqlite3.connect(tmp_path / "state" / "gpujob" / "state.db")
    try:
        return [r[0] for r in db.execute("SELECT job_id FROM jobs")]
    finally:
        db.close()


def test_killed_before_the_container_had_the_job_the_next_ps_forgets_it_and_says_so(tmp_path):
    env, job = killed_submit(tmp_path, "submit_reserved")
    assert not (tmp_path / "root" / "jobs" / job).exists()
    ps = cli(["ps"], env)
    err = ps.stderr.decode()
    assert ps.returncode == 0, err
    assert f"gpujob: {job} was never started: its submit (gpujob pid " in err
    assert "ended before lab/box had the job; forgotten" in err, err
    assert job not in ps.stdout.decode() and "not_found" not in ps.stdout.decode()
    again = cli(["ps", "--json"], env)
    assert again.returncode == 0 and json.loads(again.stdout) == [] and again.stderr == b""
    assert tab_jobs(env) == []
    st = cli(["status", job], env)
    assert st.returncode != 0 and f"no job {job!r} on this laptop" in st.stderr.decode()


def test_killed_after_the_agent_started_it_the_job_is_real_and_ps_shows_it(tmp_path):
    env, job = killed_submit(tmp_path, "submit_answered")
    try:
        ps = cli(["ps", "--json"], env)
        assert ps.returncode == 0 and ps.stderr == b"", ps.stderr.decode()
        rows = json.loads(ps.stdout)
        assert [r["job"] for r in rows] == [job]
        assert rows[0]["state"] not in ("not_found", "submitting"), rows
        assert tab_jobs(env) == [job]
    finally:
        assert cli(["stop", job], env).returncode == 0


def test_a_submit_going_on_in_another_shell_is_shown_submitting_not_forgotten(tmp_path):
    """Its gpujob lives: the row is not a phantom (the submit has not been answered yet)."""
    import sqlite3
    env = local_env(tmp_path)
    from gpujob.ops.state import State
    state = State(tmp_path / "state" / "gpujob" / "state.db")  # this process: the submitter, alive
    state.reserve("j-live", "j", "lab/box", str(tmp_path / "j.yaml"), "h", "base")
    state.close()
    ps = cli(["ps", "--json"], env)
    assert ps.returncode == 0 and ps.stderr == b"", ps.stderr.decode()
    assert [(r["job"], r["state"]) for r in json.loads(ps.stdout)] == [("j-live", "submitting")]
    db = sqlite3.connect(tmp_path / "state" / "gpujob" / "state.db")
    assert db.execute("SELECT state FROM jobs").fetchall() == [("submitting",)]
