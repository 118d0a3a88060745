"""Issue 35 row 2 (the rest): an agent's answer stays bounded whatever the container holds
(the controller takes at most 8 MiB from one: transport/base.py MAX_ANSWER), each listing cut
to a bounded number with the rest counted and said; and ``ps`` cancels a target it gave up
on (its connection closed) instead of leaving its thread running after the table."""

from __future__ import annotations

import json
import os
import subprocess
import threading

from helpers import gpujob_argv, local_env

from gpujob.agent.base import answers


def cli(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(gpujob_argv() + args, env=env, capture_output=True, timeout=600)


def register(root, job_id: str, paths: list) -> None:
    """A checkpoint register as the supervisor writes one (agent/home/ckregister.py)."""
    from gpujob.agent.home import ckregister, ckscan
    reg = ckregister.empty(job_id, "x")
    reg["runs"] = [{"run": 1, "started_at": 1.0}]
    reg["files"] = {p: {"sig": ckscan.signature(p), "real": ckscan.real_dir(p)} for p in paths}
    os.makedirs(os.path.dirname(ckregister.path_of(str(root), job_id)), exist_ok=True)
    ckregister.save(str(root), reg)


def test_gc_of_tens_of_thousands_of_checkpoints_answers_within_the_cap(tmp_path):
    """20,000 checkpoints at a long path: their rows alone are ~10 MB, past the 8 MiB cap."""
    env = local_env(tmp_path)
    root = tmp_path / "root"
    d = tmp_path / ("d" * 200) / ("c" * 200)
    d.mkdir(parents=True)
    paths = []
    for i in range(20000):
        p = d / f"checkpoint-{i:06d}"
        p.write_bytes(b"x")
        paths.append(str(p))
    register(root, "j1", paths)
    p = cli(["gc", "box", "--keep-checkpoints", "0", "--dry-run", "--json"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert len(p.stdout) < 1 << 20, len(p.stdout)
    res = json.loads(p.stdout)
    assert (len(res["checkpoints"]) == answers.LIST_MAX
            and res["more"]["checkpoints"] == 20000 - answers.LIST_MAX)
    assert res["counts"]["checkpoints"] == {"all": 20000, "remove": 20000} and res["freed"] == 20000
    assert all(os.path.exists(x) for x in paths[:10])  # a dry run
    p = cli(["gc", "box", "--keep-checkpoints", "0"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert "19800 more checkpoints not listed (of 20000, 20000 removed)" in \
        p.stdout.decode().replace("\n", "")
    assert not any(os.path.exists(x) for x in paths)


def big_ledger(root, name: str, verdicts: int) -> None:
    """A ledger of many verdicts (each with a long reason), as ledgerfile reads it."""
    hist = [{"before": None, "id": i + 1, "profile": f"p{i % 7}", "reason": f"slow {i} " + "r" * 400,
             "status": "bad" if i % 2 else "good", "threshold": None, "time": 1.7e9 + i,
             "window_medians": None}
            for i in range(verdicts)]
    led = {"format": 2, "history": hist, "last_good": "p0", "next_id": verdicts + 1,
           "profiles": {f"p{k}": {"at": 1.7e9, "reason": "r", "status": "good"} for k in range(7)}}
    (root / "ledger").mkdir(parents=True, exist_ok=True)
    (root / "ledger" / f"{name}.json").write_text(json.dumps(led))


def test_ledgers_of_many_verdicts_stay_bounded_in_profiles_status_and_history(tmp_path):
    env = local_env(tmp_path)
    root = tmp_path / "root"
    for name in ("a", "b"):  # ~5 MB each: profiles carried both whole (10 MB)
        big_ledger(root, name, 11000)
    p = cli(["profiles", "box", "--json"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    res = json.loads(p.stdout)
    for name in ("a", "b"):
        led = res["ledgers"][name]
        assert len(led["history"]) == answers.LEDGER_HISTORY and led["more"]["history"] == 11000 - 20
        assert led["history"][-1]["id"] == 11000 and set(led["profiles"]) == {f"p{k}" for k in range(7)}
    p = cli(["ledger", "history", "box", "a"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    lines = p.stdout.decode().splitlines()
    assert lines[0] == f"({11000 - answers.HISTORY_MAX} older verdicts not listed)"
    assert len(lines) == 1 + answers.HISTORY_MAX and "11000" in lines[-1]
    j = root / "jobs" / "j1"
    j.mkdir(parents=True)
    (j / "job.json").write_text(json.dumps({"format": 1, "job_id": "j1", "spec": {"name": "a"}}))
    (j / "state.json").write_text(json.dumps({"format": 1, "state": "finished", "job_id": "j1"}))
    p = cli(["status", "j1", "-t", "box", "--json"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert len(p.stdout) < 1 << 20


def test_a_fetch_given_up_on_is_cancelled_and_its_thread_ends():
    """ps's fanout: the host that never answers has its connection closed at the deadline."""
    from gpujob.ops import fanout
    closed = threading.Event()

    def fetch(key):
        if key == "good":
            return {"ok": 1}
        if not closed.wait(600):  # a read from a host that never answers, until it is closed
            return "never closed"
        raise ConnectionError("closed")

    got = fanout.gather(["good", "mute"], fetch, workers=4, deadline=0.5, cancel=lambda key: closed.set())
    assert got["good"] == {"ok": 1} and isinstance(got["mute"], fanout.NoAnswer)
    left = [t for t in threading.enumerate() if t.name == "gpujob-ask-mute"]
    for t in left:
        t.join(60)
    assert closed.is_set() and not any(t.is_alive() for t in left)


def test_a_begun_question_given_up_on_is_cancelled_on_its_channel():
    from gpujob.ops import fanout
    cancelled = []

    class Handle:
        def cancel(self):
            cancelled.append(1)

    def end(key, handle, until):
        raise TimeoutError

    got = fanout.gather(["mute"], lambda k: None, workers=1, deadline=0.1, begin=lambda k: Handle(), end=end)
    assert isinstance(got["mute"], fanout.NoAnswer) and cancelled == [1]


def test_ps_all_of_a_container_that_ran_thousands_of_jobs(tmp_path):
    """3,000 job directories with a full state each (~8 KB: the last 120 samples, pauses): the
    whole journal's status is ~24 MB; ``ps --all`` asks for the newest ``--limit`` only."""
    env = local_env(tmp_path)
    jobs = tmp_path / "root" / "jobs"
    recent = [[1.7e9 + i, 12345.678 + i] for i in range(120)]
    for n in range(3000):
        j = jobs / f"job-{n:05d}"
        j.mkdir(parents=True)
        (j / "job.json").write_text(json.dumps({"format": 1, "job_id": j.name, "spec": {"name": "x"},
                                                "submitted_at": 1.7e9 + n}))
        (j / "state.json").write_text(json.dumps({"format": 1, "state": "finished", "job_id": j.name,
                                                  "tps_recent": recent, "pauses": recent}))
        os.utime(j / "job.json", (1.7e9 + n, 1.7e9 + n))
    p = cli(["ps", "--all", "box", "--json"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    rows = json.loads(p.stdout)
    assert [r["job"] for r in rows] == [f"job-{n:05d}" for n in range(2999, 2979, -1)]
    p = cli(["ps", "--all", "box", "--limit", "5"], env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert "2995 older jobs in lab/box's journal not listed" in p.stderr.decode()
