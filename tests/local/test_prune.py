"""Disk hygiene: `gpujob gc --older-than DAYS` removes the directories of jobs that
ended that long ago, `--keep-checkpoints K` keeps the newest K of the checkpoints
each job's runs wrote (the checkpoint register), never anything else a glob
matches; never a live job's. A gc SIGKILLed mid-prune
(inside a job directory's removal, inside a checkpoint folder's) leaves no live job
touched, and the next gc finishes what it left. Real jobs on the local target; the
agent killed at a precise point by a real SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from gpujob.agent.verbs import prune
from gpujob.ops.wheelhouse import build_indexes
from helpers import REPO, cli, cli_json, job_id_of, local_env, wait_for, write_spec


def test_select_jobs_and_checkpoints_pure():
    day = 86400.0
    jobs = [{"job_id": "a", "live": True, "ended_at": None}, {"job_id": "b", "live": False, "ended_at": None},
            {"job_id": "c", "live": False, "ended_at": 0.0},
            {"job_id": "d", "live": False, "ended_at": 9 * day}]
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

    def spec(path, steps, every, interval=0.05):
        p = write_spec(path, target="box", fast_url=idx["fast"], slow_url=idx["slow"], profile="fast",
                       throughput=False, warmup=False, trainer_args=f"--steps {steps} --interval {interval} "
                       f"--checkpoint-dir ckpt/{{job_id}} --checkpoint-every {every}")
        data = yaml.safe_load(p.read_text())
        data["train"]["checkpoint"] = {"path": "ckpt/{job_id}/checkpoint-*", "every": "1h", "settle": "0.2s"}
        p.write_text(yaml.safe_dump(data))
        return p
    # checkpoints are what the trainers wrote (HF-style checkpoint-N/ folders), recorded in the register
    old = job_id_of(cli(["submit", str(spec(tmp_path / "old.yaml", 5, 1)), "--follow"], env,
                        timeout=120).stdout)
    live = job_id_of(cli(["submit", str(spec(tmp_path / "live.yaml", 100000, 3, 0.1))], env,
                         check=True).stdout)
    work = root / "work" / "tjob" / "ckpt"
    wait_for(lambda: (work / live / "checkpoint-6" / "trainer_state.json").exists(), 60, what="live's saves")
    for n in range(40):  # enough files in the old job's directory to be cut halfway
        (root / "jobs" / old / f"extra-{n}.log").write_text("x")
    live_files = sorted(p.name for p in (root / "jobs" / live).iterdir())
    (work / old / "checkpoint-0").mkdir()  # matches old's glob, but no run of old wrote it: never gc's
    (work / old / "checkpoint-0" / "keep.txt").write_text("not a checkpoint of this job")

    dry = cli_json(["gc", "box", "--older-than", "0", "--keep-checkpoints", "2", "--dry-run", "--json"], env)
    assert {j["job_id"]: j["why"] for j in dry["jobs"]} == {old: "remove", live: "live"}
    whys = {os.path.relpath(c["path"], work): c["why"] for c in dry["checkpoints"]}
    assert {k: v for k, v in whys.items() if k.startswith(old)} == {
        f"{old}/checkpoint-5": "newest 2", f"{old}/checkpoint-4": "newest 2", f"{old}/checkpoint-3": "remove",
        f"{old}/checkpoint-2": "remove", f"{old}/checkpoint-1": "remove"}
    assert {v for k, v in whys.items() if k.startswith(live)} == {"a live job's"}
    # a dry run removes nothing
    assert (root / "jobs" / old).is_dir() and len(list((work / old).iterdir())) == 6
    assert cli_json(["gc", "box", "--older-than", "1", "--json"], env)["jobs"][0]["why"].startswith(
        "ended 0.0 days")
    live_ckpts = sorted(p.name for p in (work / live).iterdir())

    # death 1: SIGKILL inside the removal of a checkpoint folder (checkpoints go first)
    p = agent_killed_at(root, ".gc-checkpoint-1", ["--older-than", "0", "--keep-checkpoints", "2"])
    assert p.returncode == -9, p.stderr.decode()
    assert [r.suffix for r in (root / ".gc").iterdir()] == [".json"]  # the record of the cut folder
    assert not (work / old / "checkpoint-1").exists()  # hidden (.gc-checkpoint-1-PID): no glob matches it
    assert [d.name for d in (work / old).iterdir() if d.name.startswith(".gc-")] != []
    # death 2: the next gc finishes that, then is SIGKILLed inside the old job directory's removal
    p = agent_killed_at(root, f"job-{old}", ["--older-than", "0", "--keep-checkpoints", "2"])
    assert p.returncode == -9, p.stderr.decode()
    assert sorted(p.name for p in (work / old).iterdir()) == ["checkpoint-0", "checkpoint-4", "checkpoint-5"]
    assert not (root / "jobs" / old).exists()  # renamed away in one step: no command sees half a job
    assert [d.name.startswith(f"job-{old}") for d in (root / ".gc").iterdir()] == [True]
    assert cli(["status", old], env).returncode == 5
    # the live job was never touched
    assert cli_json(["status", live, "--json"], env)["state"] == "training"
    assert set(live_files) <= {p.name for p in (root / "jobs" / live).iterdir()}
    assert set(live_ckpts) <= {p.name for p in (work / live).iterdir()}

    res = cli_json(["gc", "box", "--older-than", "0", "--keep-checkpoints", "2", "--json"], env)
    assert len(res["finished"]) == 1 and f"job-{old}" in res["finished"][0]
    assert list((root / ".gc").iterdir()) == []
    assert {j["job_id"]: j["why"] for j in res["jobs"]} == {live: "live"}
    # the register outlives the job's directory: its checkpoints are still known to be old's
    out = cli(["gc", "box", "--keep-checkpoints", "0"], env, check=True).stdout.decode()
    assert "kept: a live job's" in out and "removed" in out
    assert sorted(p.name for p in (work / old).iterdir()) == ["checkpoint-0"]  # the unrelated one stays
    assert (work / old / "checkpoint-0" / "keep.txt").exists()
    assert set(live_ckpts) <= {p.name for p in (work / live).iterdir()}
    p = cli(["gc", "box"], env)
    assert p.returncode == 2 and "--older-than" in p.stderr.decode()
    cli(["stop", live], env, check=True)


def test_gc_of_a_venv_killed_halfway_leaves_no_half_venv_and_the_next_gc_finishes_it(tmp_path):
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    env = local_env(tmp_path)
    root = tmp_path / "root"
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      profile="slow", throughput=False, warmup=False,
                      trainer_args="--steps 2 --interval 0.01")
    assert cli(["submit", str(spec), "--follow"], env, timeout=120).returncode == 0
    # not known-good: gc may take it
    cli(["ledger", "set", "box", "tjob", "slow", "untried"], env, check=True)
    (venv,) = [d.name for d in (root / "envs").iterdir() if d.name.startswith("slow-")]
    p = agent_killed_at(root, f"env-{venv}", ["--days", "0"])
    assert p.returncode == -9, p.stderr.decode()
    assert not (root / "envs" / venv).exists()  # gone from envs/ in one step: never a half venv there
    assert [d.name.startswith(f"env-{venv}") for d in (root / ".gc").iterdir()] == [True]
    res = cli_json(["gc", "box", "--days", "0", "--json"], env)
    assert len(res["finished"]) == 1 and list((root / ".gc").iterdir()) == []
