"""nanoGPT never resumes from another job's ckpt.pt by accident, and `submit --resume-from A` gets
exactly A's (issue 38 row 4, item 3). nanoGPT's --init_from=resume loads OUT/ckpt.pt and every save
rewrites that one file: the recipe gives each job its own OUT/{job_id}, and for a trainer that resumes
from a fixed place the supervisor copies the chosen checkpoint there before the trainer starts (beside
it, then renamed in). Jobs A then B of one workdir save; a job started from A resumes at A's step, not
B's newer one; the copy is never counted as that job's own. And the supervisor SIGKILLed mid-copy (its
copy whole beside the place, not yet renamed in; then torn, as a copy cut short is): nothing half-copied
stands at the place, and a revived supervisor copies again and resumes from A's. Local kind, the
recipes' nanoGPT stand-in (tests/data/recipes/standin.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from helpers import cli, events, job_id_of, local_env, wait_for

STANDIN = Path(__file__).parents[1] / "data" / "recipes"


def spec_file(tmp_path: Path, iters: int, eval_every: int = 10) -> Path:
    """The nanoGPT recipe's job on the stand-in: a save at every step N with N % eval_every == 2."""
    spec = {"recipe": "nanogpt", "name": "nano", "target": "box",
            "sync": [{"src": str(STANDIN), "dest": ".", "exclude": ["__pycache__"]}],
            "profiles": [{"name": "fast", "system_site_packages": True, "env": {"STANDIN_INTERVAL": "0.05"}}],
            "train": {"command": f"python standin.py nanogpt --eval_interval={eval_every} "
                                 f"--max_iters={iters}", "grace": "3s"},
            "throughput": None}
    path = tmp_path / f"job-{iters}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def state_of(tmp_path: Path, job: str) -> dict:
    try:
        return json.loads((tmp_path / "root" / "jobs" / job / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def run(tmp_path: Path, env: dict, iters: int, *more: str) -> str:
    p = cli(["submit", str(spec_file(tmp_path, iters)), "--follow", *more], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    return job_id_of(p.stdout)


def own_files(tmp_path: Path, job: str) -> dict:
    try:
        return json.loads((tmp_path / "root" / "checkpoints" / f"{job}.json").read_text())["files"]
    except (OSError, ValueError):
        return {}


def two_jobs(tmp_path: Path, env: dict) -> tuple:
    """A saves last at step 22, then B (same workdir, same out_dir) at 42."""
    a = run(tmp_path, env, 24)
    b = run(tmp_path, env, 44)
    work = tmp_path / "root" / "work" / "nano"
    assert (work / "out" / a / "ckpt.pt").read_text() == "22"
    assert (work / "out" / b / "ckpt.pt").read_text() == "42"
    assert not (work / "out" / "ckpt.pt").exists()
    # B's warmup was skipped: its per-job out_dir and --max_iters change nothing compiled
    assert [e["type"] for e in events(tmp_path / "root" / "jobs" / b)
            if e["type"] in ("warmup_skipped", "warm_marked")] == ["warmup_skipped"]
    return a, b, work


def test_resume_from_a_job_gets_that_jobs_ckpt_pt_not_the_newest_in_the_workdir(tmp_path):
    env = local_env(tmp_path)
    plan = cli(["submit", str(spec_file(tmp_path, 24)), "--plan"], env, check=True)
    assert "--out_dir=out/nano-" in plan.stdout.decode()  # the plan shows the per-job out_dir that runs
    a, b, work = two_jobs(tmp_path, env)
    plan = cli(["submit", str(spec_file(tmp_path, 30)), "--plan", "--resume-from", a], env, check=True)
    assert "resuming on purpose from " + a in plan.stdout.decode()
    assert "its checkpoint copied into this job's out/nano-" in plan.stdout.decode(), plan.stdout.decode()
    # C starts from A's step 22 and runs to 30 without a save of its own (eval every 1000)
    p = cli(["submit", str(spec_file(tmp_path, 30, eval_every=1000)), "--follow", "--resume-from", a], env,
            timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    c = job_id_of(p.stdout)
    said = p.stdout.decode() + p.stderr.decode()  # submit says where it goes
    assert f"resuming on purpose from {work / 'out' / a / 'ckpt.pt'} (job {a})" in said, said[-3000:]
    assert f"copied into this job's out/{c}/ckpt.pt before the trainer starts" in said, said[-3000:]
    log = (tmp_path / "root" / "jobs" / c / "train.log").read_text()
    assert "resumed from checkpoint at step 22" in log, log[-2000:]
    ev = events(tmp_path / "root" / "jobs" / c)
    [point] = [e for e in ev if e["type"] == "resume_point"]
    assert point["copied_from"] == str(work / "out" / a / "ckpt.pt")
    assert point["file"] == str(work / "out" / c / "ckpt.pt")
    assert f"copied from {work / 'out' / a / 'ckpt.pt'} to this job's out/{c}/ckpt.pt" in point["note"]
    assert point["note"] in (tmp_path / "root" / "jobs" / c / "job.log").read_text()  # the job log says so
    assert not any(e["type"] == "checkpoints_left" and str(work / "out" / c / "ckpt.pt") in e["files"]
                   for e in ev)  # the copy is not an earlier job's file left there
    assert own_files(tmp_path, c) == {}  # nor a checkpoint C wrote: its trainer never rewrote it
    assert (work / "out" / a / "ckpt.pt").read_text() == "22"  # A's own file untouched
    # D from A too, saving on: its rewrite of the copy is its own checkpoint
    d = run(tmp_path, env, 40, "--resume-from", a)
    assert "resumed from checkpoint at step 22" in (tmp_path / "root" / "jobs" / d / "train.log").read_text()
    [(path, entry)] = own_files(tmp_path, d).items()
    assert path == str(work / "out" / d / "ckpt.pt") and entry["finished"]
    assert (work / "out" / d / "ckpt.pt").read_text() == "32"
    assert (work / "out" / a / "ckpt.pt").read_text() == "22"
    assert (work / "out" / b / "ckpt.pt").read_text() == "42"


def test_a_supervisor_killed_mid_copy_leaves_no_half_ckpt_and_the_revived_one_resumes_from_a(tmp_path):
    env = local_env(tmp_path)
    a, b, work = two_jobs(tmp_path, env)
    died = tmp_path / "died"
    p = cli(["submit", str(spec_file(tmp_path, 30, eval_every=1000)), "--resume-from", a],
            dict(env, GPUJOB_TEST_DIE_AT=f"start_copied@{died}"))
    assert p.returncode == 0, p.stderr.decode()
    c = job_id_of(p.stdout)
    wait_for(died.exists, 90, what="the supervisor to die mid-copy")
    sup = state_of(tmp_path, c)["supervisor_pid"]
    wait_for(lambda: not os.path.exists(f"/proc/{sup}/status")
             or "State:\tZ" in open(f"/proc/{sup}/status").read(), 10, what="the supervisor gone")
    place = work / "out" / c
    assert not (place / "ckpt.pt").exists()  # nothing at the place the trainer loads from
    [tmp] = [f for f in place.iterdir() if f.name.startswith(".ckpt.pt.gpujob-copy")]
    assert tmp.read_text() == "22"
    tmp.write_text("2")  # as a copy cut short leaves it: torn
    assert not [e for e in events(tmp_path / "root" / "jobs" / c) if e["type"] == "phase"
                and e["phase"] == "train"]  # the trainer never started
    p = cli(["status", c], env)  # revives the job's supervisor
    assert p.returncode == 0, p.stderr.decode()
    wait_for(lambda: state_of(tmp_path, c).get("state") in ("succeeded", "failed", "stopped"), 120,
             what="the revived job to end")
    assert state_of(tmp_path, c)["state"] == "succeeded"
    log = (tmp_path / "root" / "jobs" / c / "train.log").read_text()
    assert "resumed from checkpoint at step 22" in log, log[-2000:]
    assert sorted(f.name for f in place.iterdir()) == ["ckpt.pt"]  # the torn temp removed
    assert (place / "ckpt.pt").read_text() == "22"
    assert (work / "out" / a / "ckpt.pt").read_text() == "22"
