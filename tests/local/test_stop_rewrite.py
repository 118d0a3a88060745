"""Issue 34 item 4's `stop` while a checkpoint is being rewritten: nanoGPT rewrites ckpt.pt
in place (torch.save, no rename) at each eval; a trainer that does so every ~2 s, more often
than the recipe's settle (5 s), never leaves the file unchanged that long. A stop used to
wait the whole save_wait (60 s) for it without a word on the laptop, then mark it torn: no
checkpoint kept. Now it signals the trainer between two writes (the file unchanged 1 s),
and that checkpoint is this job's last finished one: `rollback --to` resumes from it.
Through the installed entry point on the local kind, nanoGPT's stand-in."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from helpers import cli, cli_json, job_id_of, local_env, wait_for

STANDIN = Path(__file__).parents[1] / "data" / "recipes" / "standin.py"


def rewriting(tmp_path: Path, env: dict) -> tuple[str, Path]:
    """A nanoGPT-shaped job saving out/<job>/ckpt.pt in place every ~2 s, five saves in: (job, train.log)."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "recipe": "nanogpt", "name": "rw", "target": "lab/box",
        "sync": [{"src": str(STANDIN), "dest": "standin.py"}],
        "profiles": [{"name": "fast", "system_site_packages": True},
                     {"name": "other", "system_site_packages": True}],
        "train": {"command": "python standin.py nanogpt --batch_size=1 --block_size=1000 "
                             "--gradient_accumulation_steps=1 --eval_interval=40 --max_iters=100000",
                  "checkpoint": {"every": "20s"}},
        "throughput": None}))
    job = job_id_of(cli(["submit", str(tmp_path / "job.yaml")], env, check=True).stdout)
    log = tmp_path / "root" / "jobs" / job / "train.log"
    wait_for(lambda: log.exists() and log.read_text().count("saving checkpoint to out") >= 5, 120,
             what="five saves of ckpt.pt")
    return job, log


def test_stop_of_a_trainer_rewriting_its_checkpoint_every_2s_answers_and_keeps_it(tmp_path):
    env = dict(local_env(tmp_path), STANDIN_INTERVAL="0.05")  # 20 steps/s: a save every 40 steps is ~2 s
    job, log = rewriting(tmp_path, env)
    stop = cli(["stop", job], env, timeout=120)
    said = stop.stdout.decode()
    assert stop.returncode == 0 and f"{job}: stopped" in said, said + stop.stderr.decode()
    assert "unfinished" not in said, said  # (it was: "waited 60.06s ... (unfinished: ['out/ckpt.pt'])")
    logs = cli(["logs", job], env, check=True).stdout.decode()
    if f"a checkpoint is being saved (out/{job}/ckpt.pt)" in logs:  # the stop came while it was not settled
        assert "is rewritten in place more often than settle (5s): unchanged for 1s now" in logs, logs[-2000:]
    assert "will not be resumed from" not in logs, logs[-2000:]
    saved = int((tmp_path / "root" / "work" / "rw" / "out" / job / "ckpt.pt").read_text())
    again = cli(["rollback", job, "--to", "other"], env, check=True).stdout.decode()
    assert f"{job}: had ended (stopped): it runs again" in again, again
    wait_for(lambda: "resumed from checkpoint at step" in log.read_text(), 120, what="the resume")
    resumed = int(re.search(r"resumed from checkpoint at step (\d+)", log.read_text()).group(1))
    assert resumed == saved
    assert cli(["stop", job], env, timeout=120).returncode == 0


def test_a_supervisor_killed_once_it_took_the_file_as_whole_leaves_a_stopped_job_and_a_checkpoint(tmp_path):
    """The death point (GPUJOB_TEST_DIE_AT=between_writes): the register holds the file as
    finished, the trainer is not signalled yet. The stop ends the job (its supervisor lost),
    nothing of the trainer is left, and that file is a resume point of the job."""
    from test_jobs_local import trainers_of
    marker = tmp_path / "died"
    env = dict(local_env(tmp_path), STANDIN_INTERVAL="0.05", GPUJOB_TEST_DIE_AT=f"between_writes@{marker}")
    job, log = rewriting(tmp_path, env)
    cli(["stop", job], env, timeout=300)  # its supervisor dies mid-stop: the answer may say so
    assert marker.exists()
    wait_for(lambda: cli_json(["status", job, "--json"], env)["state"] in ("stopped", "failed", "lost"), 300,
             what="the job to end under a new supervisor")
    assert cli_json(["status", job, "--json"], env)["state"] == "stopped"
    assert not trainers_of(tmp_path)
    # the file the register took as whole is this job's checkpoint: a new job resumes from it
    env.pop("GPUJOB_TEST_DIE_AT")
    again = job_id_of(cli(["submit", str(tmp_path / "job.yaml"), "--resume-from", job], env,
                          check=True).stdout)
    log2 = tmp_path / "root" / "jobs" / again / "train.log"
    wait_for(lambda: log2.exists() and "resumed from checkpoint at step" in log2.read_text(), 120,
             what="the resume")
    resumed = int(re.search(r"resumed from checkpoint at step (\d+)", log2.read_text()).group(1))
    assert resumed >= 42 and resumed % 40 == 2
    assert cli(["stop", again], env, timeout=300).returncode == 0
