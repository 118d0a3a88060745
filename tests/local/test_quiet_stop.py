"""Quiet stops (issue 38 row 7): a stop signals the trainer's main process first and gives
it time to end its workers the way its framework does (Lightning's DataLoader workers,
torchrun's ranks), then the rest of its group; the log says that gpujob stopped it."""

from __future__ import annotations

import sys
import time

import yaml

from gpujob.agent.base import proc
from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec

#: a trainer with a worker process in its group: when the worker dies of a signal its main
#: did not send, the main process reports it as DataLoader does (a traceback)
WORKERS = r'''
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
told = []
def on_term(*a):
    time.sleep(0.3)  # a framework's handler takes a moment to act
    if worker.poll() is not None:
        print(f"RuntimeError: DataLoader worker (pid {worker.pid}) is killed by signal: Terminated.",
              flush=True)
        sys.exit(1)
    worker.terminate()
    worker.wait()
    print("stopped cleanly with its workers", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("10.0 ktok/s", flush=True)
while True:
    time.sleep(0.1)
'''


def test_the_command_alone_gets_sigterm_first_and_ends_its_workers(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(WORKERS)
    log = tmp_path / "log"
    p = proc.Phase.start([sys.executable, str(script)], env=None, cwd=str(tmp_path), log_path=str(log),
                         exit_file=str(tmp_path / "exit.json"))
    wait_for(lambda: b"ktok" in log.read_bytes(), 30, what="the trainer's start")
    wait_for(lambda: len(proc.group_pids(p.pgid)) >= 3, 30, what="the worker")
    assert p.kill(5, first=3) == []
    assert "stopped cleanly with its workers" in log.read_text() and "RuntimeError" not in log.read_text()
    # the whole group at once (before): the worker dies of a signal its main did not send
    p = proc.Phase.start([sys.executable, str(script)], env=None, cwd=str(tmp_path), log_path=str(log),
                         exit_file=str(tmp_path / "exit2.json"))
    wait_for(lambda: log.read_text().count("ktok") == 2 and len(proc.group_pids(p.pgid)) >= 3, 30,
             what="the second trainer")
    p.kill(5)
    assert "RuntimeError: DataLoader worker" in log.read_text()


def test_gpujob_stop_leaves_no_traceback_and_the_log_says_gpujob_stopped_it(tmp_path):
    env = local_env(tmp_path)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "workers.py").write_text(WORKERS)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url="", slow_url="", warmup=False,
                      throughput=False)
    data = yaml.safe_load(spec.read_text())
    data["profiles"] = [{"name": "base", "system_site_packages": True}]
    data["profile"] = "base"
    data["sync"] = [{"src": str(extra), "dest": "."}]
    data["train"] = {"command": "python workers.py", "grace": "10s"}
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    jdir = tmp_path / "root" / "jobs" / job_id
    wait_for(lambda: (jdir / "train.log").exists() and "ktok" in (jdir / "train.log").read_text(), 120,
             what="the trainer")
    time.sleep(0.5)  # its worker started
    assert cli(["stop", job_id], env, timeout=120).returncode == 0
    train_log = (jdir / "train.log").read_text()
    assert "stopped cleanly with its workers" in train_log and "RuntimeError" not in train_log
    assert "gpujob stops the trainer: SIGTERM to its main process" in (jdir / "job.log").read_text()
    assert next(e for e in events(jdir) if e["type"] == "group_stopped")["left"] == []
    assert cli_json(["status", job_id, "--json"], env)["state"] == "stopped"


def test_a_supervisor_killed_right_after_the_quiet_sigterm_leaves_a_stopped_job_and_no_process(tmp_path):
    """The death point of the quiet stop (GPUJOB_TEST_DIE_AT=command_signalled): the trainer's main
    process got SIGTERM and ends its workers itself; a new supervisor finds the job stopped, and
    nothing of the trainer is left running."""
    from test_jobs_local import trainers_of
    marker = tmp_path / "died"
    env = dict(local_env(tmp_path), GPUJOB_TEST_DIE_AT=f"command_signalled@{marker}")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "workers.py").write_text(WORKERS)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url="", slow_url="", warmup=False,
                      throughput=False)
    data = yaml.safe_load(spec.read_text())
    data.update(profiles=[{"name": "base", "system_site_packages": True}], profile="base",
                sync=[{"src": str(extra), "dest": "."}],
                train={"command": "python workers.py", "grace": "10s"})
    spec.write_text(yaml.safe_dump(data))
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    jdir = tmp_path / "root" / "jobs" / job_id
    wait_for(lambda: (jdir / "train.log").exists() and "ktok" in (jdir / "train.log").read_text(), 120,
             what="the trainer")
    time.sleep(0.5)
    cli(["stop", job_id], env, timeout=120)  # its supervisor dies mid-stop: the answer may say so
    assert marker.exists()
    wait_for(lambda: cli_json(["status", job_id, "--json"], env)["state"] in ("stopped", "failed", "lost"),
             120, what="the job to end under a new supervisor")
    assert cli_json(["status", job_id, "--json"], env)["state"] == "stopped"
    assert "stopped cleanly with its workers" in (jdir / "train.log").read_text()
    assert not trainers_of(tmp_path)
