"""Works from anywhere: the demo's files ship inside the package (one source: the
repository's jobs/demo* link to them), `gpujob submit jobs/demo.yaml` on a fresh
clone builds the demo's wheels, and a job's target is found again from a
directory whose inventory does not name it (the entry recorded with the job)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from helpers import REPO, cli, job_id_of, wait_for
from gpujob.ops.state import State


def test_the_demo_has_one_source_and_it_ships_in_the_wheel(tmp_path):
    pkg = REPO / "gpujob"
    assert (REPO / "jobs" / "demo.yaml").is_symlink() and (REPO / "jobs" / "demo").is_symlink()
    assert (REPO / "jobs" / "demo.yaml").resolve() == (pkg / "demo.yaml").resolve()
    assert (REPO / "jobs" / "demo").resolve() == (pkg / "demo").resolve()
    src = tmp_path / "src"  # a clean tree: no wheelhouse or build leftovers of this checkout
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "wheelhouse", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".testbed"))
    # build_py lays out what a wheel holds (packages and package data), offline
    p = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py",
                        "--build-lib", str(tmp_path / "lib")], cwd=src, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    for rel in ("demo.yaml", "demo/trainer.py", "demo/warmup.py"):
        assert (tmp_path / "lib" / "gpujob" / rel).read_bytes() == (pkg / rel).read_bytes(), rel
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["gpujob"]  # no testbed/, bench/, tests/


def _env(tmp_path, cwd):
    return dict(os.environ, HOME=str(tmp_path / "home"), XDG_STATE_HOME=str(tmp_path / "state"),
                XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "config"),
                GPUJOB_TEST_CWD=str(cwd), COLUMNS="120")


def _fresh_clone(tmp_path):
    """jobs/demo.yaml and jobs/demo as a fresh clone has them (no wheelhouse), and
    a hosts.yaml naming a host the built-in inventory does not know."""
    clone = tmp_path / "clone"
    (clone / "jobs" / "demo").mkdir(parents=True)
    shutil.copy(REPO / "gpujob" / "demo.yaml", clone / "jobs" / "demo.yaml")
    for f in ("trainer.py", "warmup.py"):
        shutil.copy(REPO / "gpujob" / "demo" / f, clone / "jobs" / "demo" / f)
    (clone / "hosts.yaml").write_text("hosts:\n  desk:\n    kind: local\n    containers:\n"
                                      "      demo: {root: ../root}\n")  # relative: to this directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return clone, elsewhere


def test_submit_on_a_fresh_clone_then_status_logs_and_stop_from_another_directory(tmp_path):
    clone, elsewhere = _fresh_clone(tmp_path)
    env = _env(tmp_path, clone)
    p = cli(["submit", "jobs/demo.yaml", "-p", "fast"], env, check=True)
    job = job_id_of(p.stdout)
    assert "built the demo's wheels in" in p.stderr.decode()
    assert (clone / "jobs" / "demo" / "wheelhouse" / "fast" / "simple").is_dir()
    assert (tmp_path / "root" / "jobs" / job).is_dir()  # root: ../root, read from the clone's folder

    far = _env(tmp_path, elsewhere)  # no hosts.yaml here: the built-in inventory has no 'desk'
    p = cli(["exec", "desk/demo", "--", "true"], dict(far, XDG_STATE_HOME=str(tmp_path / "other")))
    assert p.returncode == 2 and b"unknown target 'desk/demo'" in p.stderr  # unknown without the record
    def training():
        st = json.loads(cli(["status", job, "--json"], far, check=True).stdout)
        return st if st["state"] == "training" else None
    st = wait_for(training, what="training", timeout=120)
    assert st["profile"] == "fast" and job in json.dumps(st)
    wait_for(lambda: b"tok/s" in cli(["logs", job], far, check=True).stdout, what="a step line")
    cli(["stop", job], far, check=True)
    assert json.loads(cli(["status", job, "--json"], far, check=True).stdout)["state"] == "stopped"
    rows = cli(["ps", "--json"], far, check=True).stdout
    assert job in rows.decode()


def test_a_missing_relative_index_is_one_line_and_nothing_starts(tmp_path):
    clone, _ = _fresh_clone(tmp_path)
    spec = clone / "jobs" / "demo.yaml"
    spec.write_text(spec.read_text().replace("file:demo/wheelhouse/slow/simple", "file:nowhere/simple"))
    p = cli(["submit", "jobs/demo.yaml"], _env(tmp_path, clone))
    err = p.stderr.decode()
    assert p.returncode == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert ("jobs/demo.yaml:23: profiles[1].index_url: no such folder: "
            f"{clone / 'jobs' / 'nowhere' / 'simple'}") in err
    assert not (tmp_path / "root").exists()  # nothing half-changed on the target side


def test_the_demo_runs_from_any_directory(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(tmp_path, elsewhere)
    p = cli(["demo"], env, timeout=300)
    out = p.stdout.decode()
    assert p.returncode == 0, out[-3000:] + p.stderr.decode()[-2000:]
    assert "ROLLBACK slow -> fast" in out and "resumed from checkpoint" in out
    assert (tmp_path / "cache" / "gpujob" / "demo-job" / "demo" / "wheelhouse" / "fast" / "simple").is_dir()
    assert not list(elsewhere.iterdir())  # nothing written where it was run
    st = json.loads(cli(["status", "--json"], env, check=True).stdout)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    assert st["window_median"] >= 10000 and st["rollbacks"][0]["signal"] == "low_throughput"
    # the summary says what the ledger says: slow is bad only once fast held for rollback.confirm
    slow = (st.get("ledger") or {}).get("slow", {}).get("status", "untried")
    said = "it marked slow bad" if slow == "bad" else f"slow stays {slow}: the job ended before fast held"
    assert said in out.split("== What happened ==")[-1], out[-1500:]


def test_an_index_from_before_gets_the_entry_column(tmp_path):
    db = tmp_path / "state.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, target TEXT NOT NULL, "
                "spec_path TEXT, spec_hash TEXT, profile TEXT, submitted_at REAL NOT NULL, state TEXT, "
                "seen_at REAL)")
    con.execute("INSERT INTO jobs VALUES ('old-1', 'old', 'a/b', NULL, NULL, 'p', 1, 'succeeded', 1)")
    con.commit()
    con.close()
    s = State(db)
    assert s.job("old-1")["target"] == "a/b" and s.entry("a/b") is None
    s.reserve("new-1", "new", "a/b", "/x.yaml", "h", "p", entry={"hosts": {"a": {"kind": "local"}}})
    assert s.entry("a/b") == {"hosts": {"a": {"kind": "local"}}}
    s.close()


@pytest.mark.parametrize("spec", ["jobs/demo.yaml", "gpujob/demo.yaml"])
def test_the_demo_spec_validates_where_it_lies(spec):
    from gpujob.spec.model import load_spec
    s = load_spec(REPO / spec)
    assert [p.name for p in s.profiles] == ["fast", "slow"]
