"""Disk hygiene: `gpujob gc --older-than DAYS` removes the directories of jobs that
ended that long ago, `--keep-checkpoints K` keeps the newest K of each job's
checkpoints (train.checkpoint.path); never a live job's. A gc SIGKILLed mid-prune
(inside a job directory's removal, inside a checkpoint folder's) leaves no live job
touched, and the next gc finishes what it left. Real jobs on the local target; the
agent killed at a precise point by a real SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from gpujob.agent import prune
from gpujob.wheelhouse import build_indexes
from helpers import REPO, cli, cli_json, job_id_of, local_env, wait_for, write_spec


def test_select_jobs_and_checkpoints_pure():
    day = 86400.0
    jobs = [{"job_id": "a", "live": True, "ended_at": None}, {"job_id": "b", "live": False, "ended_at": None},
            {"job_id": "c", "live": False, "ended_at": 0.0}, {"job_id": "d", "live": False, "ended_at": 9 * day}]
    got = {j["job_id"]: why for j, why in prune.select_jobs(jobs, 2, 10 * day)}
    assert got == {"a": "live", "b": "not ended", "c": "remove", "d": "ended 1.0 days ago"}
    groups = [{"files": [("x1", 1), ("x3", 3), ("x2", 2)], "live": False},
              {"files": [("y1", 1), ("y2", 2)], "live": True},
              {"files": [("x1", 1), ("z9", 9)], "live": False}]  # x1 also the newest-but-one here
    got = dict(prune.select_checkpoints(groups, 2))
    assert got == {"x3": "newest 2", "x2": "newest 2", "x1": "newest 2", "y1": "a live job's",
                   "y2": "a live job's", "z9": "newest 2"}
    assert dict(prune.select_checkpoints(groups[:1], 1)) == {"x3": "newest 1", "x2": "remove", "x1": "remove"}


def agent_killed_at(root, match: str, args: list) -> subprocess.CompletedProcess:
    """The real agent's gc, SIGKILLed inside the first shutil.rmtree of a path whose
    name contains ``match``, after it deleted part of that tree."""
    code = f"""
import os, shutil, signal, sys
real = shutil.rmtree
def rmtree(path, *a, **k):
    if {match!r} in os.path.basename(path):
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
        for f in files[:max(1, len(files) // 2)]:
            os.unlink(f)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, *a, **k)
shutil.rmtree = rmtree
sys.argv = ["agent", "--home", {str(root)!r}, "gc", *{args!r}]
from gpujob.agent.main import main
main()
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, cwd=REPO)


def test_gc_prunes_old_jobs_and_checkpoints_never_a_live_job_s_and_survives_sigkill(tmp_path):
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    env = local_env(tmp_path)
    root = tmp_path / "root"

    def spec(path, steps):
        p = write_spec(path, target="box", fast_url=idx["fast"], slow_url=idx["slow"], profile="fast",
                       throughput=False, warmup=False, trainer_args=f"--steps {steps} --interval 0.05")
        data = yaml.safe_load(p.read_text())
        data["train"]["checkpoint"] = {"path": "ckpt/{job_id}/step_*", "every": "1h"}
        p.write_text(yaml.safe_dump(data))
        return p
    old = job_id_of(cli(["submit", str(spec(tmp_path / "old.yaml", 4)), "--follow"], env, timeout=120).stdout)
    live = job_id_of(cli(["submit", str(spec(tmp_path / "live.yaml", 100000))], env, check=True).stdout)
    wait_for(lambda: cli_json(["status", live, "--json"], env)["state"] == "training", 60, what="training")

    work = root / "work" / "tjob" / "ckpt"
    for job in (old, live):  # five checkpoints each, step_3 a folder (as HF's Trainer writes them)
        for i in range(1, 6):
            p = work / job / f"step_{i}"
            if i == 3:
                (p / "shards").mkdir(parents=True)
                for n in range(20):
                    (p / "shards" / f"{n}.bin").write_bytes(b"x" * 100)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(b"w" * 1000)
            os.utime(p, (1000 + i, 1000 + i))
    for n in range(40):  # enough files in the old job's directory to be cut halfway
        (root / "jobs" / old / f"extra-{n}.log").write_text("x")
    live_files = sorted(p.name for p in (root / "jobs" / live).iterdir())

    dry = cli_json(["gc", "box", "--older-than", "0", "--keep-checkpoints", "2", "--dry-run", "--json"], env)
    assert {j["job_id"]: j["why"] for j in dry["jobs"]} == {old: "remove", live: "live"}
    whys = {os.path.relpath(c["path"], work): c["why"] for c in dry["checkpoints"]}
    assert whys == {f"{old}/step_5": "newest 2", f"{old}/step_4": "newest 2", f"{old}/step_3": "remove",
                    f"{old}/step_2": "remove", f"{old}/step_1": "remove",
                    **{f"{live}/step_{i}": "a live job's" for i in range(1, 6)}}
    assert (root / "jobs" / old).is_dir() and len(list((work / old).iterdir())) == 5  # a dry run removes nothing
    assert cli_json(["gc", "box", "--older-than", "1", "--json"], env)["jobs"][0]["why"].startswith("ended 0.0 days")

    # death 1: SIGKILL inside the removal of a checkpoint folder (checkpoints go first)
    p = agent_killed_at(root, ".gc-step_3", ["--older-than", "0", "--keep-checkpoints", "2"])
    assert p.returncode == -9, p.stderr.decode()
    assert [r.suffix for r in (root / ".gc").iterdir()] == [".json"]  # the record of the cut folder
    assert not (work / old / "step_3").exists()  # hidden (.gc-step_3-PID): no glob matches it
    assert [d.name.startswith(".gc-step_3") for d in (work / old).iterdir() if d.is_dir()] == [True]
    # death 2: the next gc finishes that, then is SIGKILLed inside the old job directory's removal
    p = agent_killed_at(root, f"job-{old}", ["--older-than", "0", "--keep-checkpoints", "2"])
    assert p.returncode == -9, p.stderr.decode()
    assert not any(d.is_dir() for d in (work / old).iterdir())  # the folder's leftover is gone
    assert sorted(p.name for p in (work / old).iterdir()) == ["step_4", "step_5"]
    assert not (root / "jobs" / old).exists()  # renamed away in one step: no command sees half a job
    assert [d.name.startswith(f"job-{old}") for d in (root / ".gc").iterdir()] == [True]
    assert cli(["status", old], env).returncode == 5
    # the live job was never touched
    assert cli_json(["status", live, "--json"], env)["state"] == "training"
    assert set(live_files) <= {p.name for p in (root / "jobs" / live).iterdir()}
    assert sorted(p.name for p in (work / live).iterdir()) == [f"step_{i}" for i in range(1, 6)]

    res = cli_json(["gc", "box", "--older-than", "0", "--keep-checkpoints", "2", "--json"], env)
    assert len(res["finished"]) == 1 and f"job-{old}" in res["finished"][0]
    assert list((root / ".gc").iterdir()) == []
    assert sorted(p.name for p in (work / old).iterdir()) == ["step_4", "step_5"]
    assert sorted(p.name for p in (work / live).iterdir()) == [f"step_{i}" for i in range(1, 6)]
    assert {j["job_id"]: j["why"] for j in res["jobs"]} == {live: "live"}
    out = cli(["gc", "box", "--keep-checkpoints", "1"], env, check=True).stdout.decode()
    assert "kept: a live job's" in out and "removed" not in out  # old's went with its job directory
    assert sorted(p.name for p in (work / old).iterdir()) == ["step_4", "step_5"]
    p = cli(["gc", "box"], env)
    assert p.returncode == 2 and "--older-than" in p.stderr.decode()
    cli(["stop", live], env, check=True)


def test_gc_of_a_venv_killed_halfway_leaves_no_half_venv_and_the_next_gc_finishes_it(tmp_path):
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    env = local_env(tmp_path)
    root = tmp_path / "root"
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      profile="slow", throughput=False, warmup=False, trainer_args="--steps 2 --interval 0.01")
    assert cli(["submit", str(spec), "--follow"], env, timeout=120).returncode == 0
    cli(["ledger", "set", "box", "tjob", "slow", "untried"], env, check=True)  # not known-good: gc may take it
    (venv,) = [d.name for d in (root / "envs").iterdir() if d.name.startswith("slow-")]
    p = agent_killed_at(root, f"env-{venv}", ["--days", "0"])
    assert p.returncode == -9, p.stderr.decode()
    assert not (root / "envs" / venv).exists()  # gone from envs/ in one step: never a half venv there
    assert [d.name.startswith(f"env-{venv}") for d in (root / ".gc").iterdir()] == [True]
    res = cli_json(["gc", "box", "--days", "0", "--json"], env)
    assert len(res["finished"]) == 1 and list((root / ".gc").iterdir()) == []
