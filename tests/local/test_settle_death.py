"""The Lightning recipe's 1 s `settle` with a death inside it: the trainer SIGKILLed in the
middle of a checkpoint write (the stand-in writes half of `epoch=0-step=N.ckpt` at its name
and kills itself: a death at once, well inside the 1 s a .ckpt must stay unchanged to count
as finished). With its supervisor watching, and with its supervisor SIGKILLed first (nobody
watches the torn write; a supervisor revived afterwards, when the half file has been still
for longer than settle, re-adopts the dead trainer). Either way, `rollback --to` resumes from
the last whole checkpoint of the job, never the half one. And the supervisor SIGKILLed while
the trainer is inside a slow save that it then finishes unwatched: the revived supervisor's
resume is from a whole checkpoint. Local kind, the recipe's stand-in."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from helpers import cli, events, job_id_of, local_env, wait_for

STANDIN = Path(__file__).parents[1] / "data" / "recipes"
TEAR_AT = 82  # saves at steps 2, 42, 82 (2 s apart, more than settle): the third is torn


def state_of(tmp_path, job) -> dict:
    try:
        return json.loads((tmp_path / "root" / "jobs" / job / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def register(tmp_path, job) -> dict:
    try:
        return json.loads((tmp_path / "root" / "checkpoints" / f"{job}.json").read_text())
    except (OSError, ValueError):
        return {}


def finished_steps(tmp_path, job) -> list:
    return sorted(e["step"] for e in register(tmp_path, job).get("files", {}).values() if e.get("finished"))


def gone(pid: int) -> bool:
    try:
        return "State:\tZ" in open(f"/proc/{pid}/status").read()
    except OSError:
        return True


def job_yaml() -> str:
    """The Lightning recipe's job on the stand-in: `fast` tears its save at step TEAR_AT."""
    return yaml.safe_dump({
        "recipe": "lightning", "name": "lt", "target": "lab/box",
        "sync": [{"src": str(STANDIN), "dest": ".", "exclude": ["__pycache__"]}],
        "profiles": [{"name": "fast", "system_site_packages": True,
                      "env": {"STANDIN_INTERVAL": "0.05", "STANDIN_TEAR_AT": str(TEAR_AT)}},
                     {"name": "other", "system_site_packages": True, "env": {"STANDIN_INTERVAL": "0.05"}}],
        "train": {"command": "python standin.py lightning fit --trainer.callbacks+=ModelCheckpoint "
                             "--trainer.callbacks.every_n_train_steps=40 --trainer.max_steps=100000"},
        "throughput": {"tokens_per_step": 1000, "min": "1K"}})  # ~20K tok/s: never judged slow


@pytest.mark.parametrize("supervisor", ["watching", "killed_first"])
def test_a_trainer_killed_mid_save_inside_settle_is_never_resumed_from(tmp_path, supervisor):
    env = local_env(tmp_path)
    (tmp_path / "job.yaml").write_text(job_yaml())
    job = job_id_of(cli(["submit", str(tmp_path / "job.yaml")], env, check=True).stdout)
    train_log = tmp_path / "root" / "jobs" / job / "train.log"
    if supervisor == "killed_first":  # once the step-42 save is finished: the torn one comes unwatched
        wait_for(lambda: 42 in finished_steps(tmp_path, job), 90, what="the step-42 checkpoint finished")
        sup = state_of(tmp_path, job)["supervisor_pid"]
        os.kill(sup, signal.SIGKILL)
        wait_for(lambda: gone(sup), 10, what="the supervisor gone")
        pgid = state_of(tmp_path, job)["child"]["pgid"]
        wait_for(lambda: os.path.exists(tmp_path / "root" / "jobs" / job / "train.exit")
                 or not os.path.exists(f"/proc/{pgid}"), 60, what="the trainer's death mid-save")
        time.sleep(1.5)  # the half file now older than settle (1 s) when a supervisor first sees it
    else:
        wait_for(lambda: state_of(tmp_path, job).get("state") in ("failed", "succeeded", "stopped"), 90,
                 what="the job's end after its trainer died")
    work = next((tmp_path / "root" / "work").iterdir())
    torn = list(work.glob(f"lightning_logs/version_*/checkpoints/epoch=0-step={TEAR_AT}.ckpt"))
    assert torn and torn[0].read_text() == "torn"  # the half checkpoint is there, at its name
    p = cli(["rollback", job, "--to", "other"], env)
    assert p.returncode == 0, p.stderr.decode()
    wait_for(lambda: train_log.exists() and "resumed from checkpoint at step" in train_log.read_text()
             or state_of(tmp_path, job).get("state") in ("failed", "succeeded", "stopped"), 90,
             what="the resumed trainer")
    log = train_log.read_text()
    assert "resumed from checkpoint at step 42" in log, log[-2000:]
    trains = [e for e in events(tmp_path / "root" / "jobs" / job)
              if e["type"] == "phase" and e["phase"] == "train"]
    assert trains[-1]["argv"][-1].endswith("epoch=0-step=42.ckpt"), trains[-1]["argv"]
    files = register(tmp_path, job)["files"]
    [entry] = [e for p, e in files.items() if p.endswith(f"step={TEAR_AT}.ckpt")]
    assert not entry.get("finished") and entry.get("torn"), entry
    p = cli(["stop", job], env)
    assert p.returncode == 0, p.stderr.decode()


def test_a_supervisor_killed_mid_save_then_revived_resumes_from_a_whole_checkpoint(tmp_path):
    """The supervisor SIGKILLed while the trainer is inside a save (half of it at its name);
    the trainer finishes the save unwatched and runs on; a revived supervisor takes the run
    over, and `rollback --to` resumes from a whole checkpoint (that save, or the one before)."""
    env = local_env(tmp_path)
    spec = yaml.safe_load(job_yaml())
    spec["profiles"][0]["env"] = {"STANDIN_INTERVAL": "0.05", "STANDIN_PAUSE_AT": str(TEAR_AT),
                                  "STANDIN_SAVE_PAUSE": "2"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    job = job_id_of(cli(["submit", str(tmp_path / "job.yaml")], env, check=True).stdout)
    work = tmp_path / "root" / "work" / "lt"
    half = work / "lightning_logs" / "version_0" / "checkpoints" / f"epoch=0-step={TEAR_AT}.ckpt"

    def saving() -> bool:
        try:
            return half.read_text() == "torn"
        except OSError:
            return False
    wait_for(saving, 90, what="the trainer inside its slow save")
    sup = state_of(tmp_path, job)["supervisor_pid"]
    os.kill(sup, signal.SIGKILL)  # the save in progress, well inside its settle window
    wait_for(lambda: gone(sup), 10, what="the supervisor gone")
    wait_for(lambda: half.exists() and half.read_text() == str(TEAR_AT), 30,
             what="the save finished unwatched")
    p = cli(["rollback", job, "--to", "other"], env)  # revives the job first, then rolls it back
    assert p.returncode == 0, p.stderr.decode()
    train_log = tmp_path / "root" / "jobs" / job / "train.log"
    wait_for(lambda: "resumed from checkpoint at step" in train_log.read_text()
             or state_of(tmp_path, job).get("state") in ("failed", "succeeded", "stopped"), 90,
             what="the resumed trainer")
    log = train_log.read_text()
    assert "resumed from checkpoint at step" in log and "ValueError" not in log, log[-2000:]
    at = int(log.split("resumed from checkpoint at step ")[1].split()[0])
    assert at in (42, TEAR_AT), at
    p = cli(["stop", job], env)
    assert p.returncode == 0, p.stderr.decode()
