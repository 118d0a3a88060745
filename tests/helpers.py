"""Shared helpers for the job tests: run the real CLI, write specs, read journals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TRAINER_DIR = REPO / "jobs" / "demo"


#: the installed console script (``pip install -e .`` puts it beside the venv's python):
#: what users run, and what the suite runs
GPUJOB = Path(sys.executable).parent / "gpujob"


def gpujob_argv() -> list[str]:
    """The argv that starts ``gpujob`` as users start it (for Popen, pty and shell uses)."""
    if not os.access(GPUJOB, os.X_OK):
        raise AssertionError(f"no gpujob console script at {GPUJOB}: install gpujob into the python "
                             f"that runs the tests (pip install -e '.[test]', as scripts/test does)")
    return [str(GPUJOB)]


def user_env(env: dict, *, daemon: bool = True) -> dict:
    """``env`` as the suite runs gpujob under it: the kept connection on (the session's
    runtime dir and idle time, tests/conftest.py, unless ``env`` says otherwise), or off
    (``daemon=False``: the direct path)."""
    e = dict(env)
    for k in ("XDG_RUNTIME_DIR", "GPUJOB_CONN_IDLE"):
        if k not in e and k in os.environ:
            e[k] = os.environ[k]
    if not daemon:
        e["GPUJOB_NO_DAEMON"] = "1"
    return e


def cli(args: list[str], env: dict, *, input: bytes | None = None, timeout: float = 180,
        check: bool = False, daemon: bool = True) -> subprocess.CompletedProcess:
    """Run ``gpujob ARGS`` as a user would: a fresh process of the installed console script,
    the kept connection on (its default); ``daemon=False`` (cli_direct) turns it off."""
    p = subprocess.run([*gpujob_argv(), *args], env=user_env(env, daemon=daemon), input=input,
                       capture_output=True, timeout=timeout, cwd=env.get("GPUJOB_TEST_CWD", str(REPO)))
    if check and p.returncode != 0:
        raise AssertionError(f"gpujob {' '.join(args)} exited {p.returncode}\n"
                             f"stdout: {p.stdout.decode()[-3000:]}\nstderr: {p.stderr.decode()[-3000:]}")
    return p


def cli_direct(args: list[str], env: dict, **kw) -> subprocess.CompletedProcess:
    """``gpujob ARGS`` with GPUJOB_NO_DAEMON=1: every command connects directly."""
    return cli(args, env, daemon=False, **kw)


def cli_json(args: list[str], env: dict, **kw):
    p = cli(args, env, check=True, **kw)
    return json.loads(p.stdout)


def write_spec(path: Path, *, target: str, fast_url: str, slow_url: str, profile: str = "slow",
               trainer_args: str = "--steps 30 --interval 0.1", throughput: dict | None = None,
               rollback: dict | None = None, warmup: bool = True, **extra) -> Path:
    """A job spec for the stand-in trainer with two real profiles (fast, slow)."""
    spec = {
        "name": extra.pop("name", "tjob"),
        "target": target,
        "sync": [{"src": str(TRAINER_DIR), "dest": ".",
                  "exclude": ["wheelhouse", "__pycache__", "checkpoint.json"]}],
        "gpus": {"target": [0, 1], "drafter": [2, 3]},
        "profiles": [
            {"name": "fast", "index_url": fast_url, "packages": ["gpujob-demo-kernels==1.0.0+fast"]},
            {"name": "slow", "index_url": slow_url, "packages": ["gpujob-demo-kernels==1.0.0+slow"]},
        ],
        "profile": profile,
        "train": {"command": f"python trainer.py {trainer_args}", "resume_args": ["--resume"],
                  "grace": "3s"},
    }
    if warmup:
        spec["warmup"] = {"command": "python warmup.py", "per_gpu": "drafter", "timeout": "1m"}
    if throughput is not False:
        spec["throughput"] = throughput or {"format": "ktok", "window": 3, "min": "10K",
                                            "failure_limit": 2, "no_data_timeout": "30s",
                                            "good_after": "1s"}
    if rollback is not None:
        spec["rollback"] = rollback
    spec.update(extra)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def wait_for(pred, timeout: float = 60, every: float = 0.1, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


#: the hang guard: how long a call that should end at once (woken, killed, given up on) may
#: take before the test calls it hung. A guard, never a bound on speed (tests/README.md)
HANG = 60.0


def returns(fn, what: str, hang: float = HANG):
    """``fn()``'s value, or the exception it raised, from a daemon thread; a call still
    running after ``hang`` seconds fails the test as "hung" (it is left to its thread)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            box["error"] = e
    th = threading.Thread(target=run, daemon=True, name="gpujob-test-returns")
    th.start()
    th.join(hang)
    if th.is_alive():
        raise AssertionError(f"hung: {what} had not returned after {hang:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def job_id_of(stdout: bytes) -> str:
    m = re.search(r"^submitted (\S+) ", stdout.decode(), re.M)
    if not m:
        raise AssertionError(f"no job id in: {stdout!r}")
    return m.group(1)


def events(journal_dir: Path) -> list[dict]:
    path = journal_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def local_env(tmp: Path, root: Path | None = None) -> dict:
    """Environment for a CLI run against a private local target ``lab/box``."""
    root = root or tmp / "root"
    hosts = tmp / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "box": {"root": str(root)}}}}}))
    env = dict(os.environ)
    env.update(GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"), COLUMNS="200")
    return env
