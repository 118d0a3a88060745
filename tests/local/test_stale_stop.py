"""A queued `stop` that outlives its supervisor (issue 34/38 follow-up): the stop request is
written to the job's control/ queue, and the supervisor is SIGKILLed before it acts on it.
That request must not later stop a `gpujob rollback --to PROFILE` of the same job: a stop
applies to the run it was aimed at only. The death is injected by hand (the supervisor frozen
with SIGSTOP while the request is written, then SIGKILLed), so the tests say nothing about
when the supervisor polls its queue. On the `local` kind through the installed entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from helpers import cli, events, job_id_of, local_env, wait_for, write_spec
from test_faults import jdir, journal_is_sound, state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of


def training_job(tmp_path, env, wheelhouse) -> str:  # noqa: F811 (the fixture's value)
    urls = wheelhouse[1]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="slow", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.05")
    job = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    wait_for(lambda: (state_of(tmp_path, job).get("child") or {}).get("phase") == "train", 60,
             what="the trainer")
    return job


def queued(tmp_path, job) -> list:
    return sorted((jdir(tmp_path, job) / "control").glob("*-stop.json"))


def stop_then_kill(tmp_path, job, wait: str, gave_up: bool = False) -> subprocess.Popen:
    """`stop` asked of a frozen supervisor, which is SIGKILLed once the request is queued
    (``gave_up``: once the stop's wait has ended, the request left queued)."""
    sup = state_of(tmp_path, job)["supervisor_pid"]
    os.kill(sup, signal.SIGSTOP)  # it cannot act on the request: it will die first
    try:
        stop = subprocess.Popen([sys.executable, "-m", "gpujob.agent.main", "--home", str(tmp_path / "root"),
                                 "stop", job, "--wait", wait], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: queued(tmp_path, job), 30, what="the stop request in the queue")
        if gave_up:
            stop.wait(60)
    finally:
        os.kill(sup, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{sup}") or
             open(f"/proc/{sup}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 10,
             what="the killed supervisor to be gone")
    return stop


def runs_on_fast(tmp_path, job) -> None:
    """The rollback's trainer runs on fast and keeps running: no stop took it."""
    wait_for(lambda: state_of(tmp_path, job).get("state") in ("stopped", "failed", "succeeded")
             or (state_of(tmp_path, job).get("child") or {}).get("profile") == "fast", 90,
             what="the rollback to fast, or the job's end")
    st = state_of(tmp_path, job)
    assert st.get("state") == "training" and st["profile"] == "fast", (st.get("state"), st.get("reason"))
    wait_for(lambda: len(trainers_of(tmp_path)) == 1, 20, what="fast's trainer")
    for _ in range(20):  # a supervisor that took the stale stop would end it within this
        time.sleep(0.1)
        assert state_of(tmp_path, job).get("state") == "training", state_of(tmp_path, job).get("reason")
    assert not queued(tmp_path, job)


def finish(tmp_path, env, job) -> None:
    p = cli(["stop", job], env)
    assert p.returncode == 0, p.stderr.decode()
    assert state_of(tmp_path, job)["state"] == "stopped" and not trainers_of(tmp_path)
    journal_is_sound(jdir(tmp_path, job))


def test_a_stop_whose_supervisor_died_then_ended_by_the_stop_itself_leaves_no_request(tmp_path, wheelhouse):
    """The stop waits, sees the supervisor lost and ends the job itself (stopped); its
    request is carried out then and there, so `rollback --to fast` runs the job again."""
    env = local_env(tmp_path)
    job = training_job(tmp_path, env, wheelhouse)
    stop = stop_then_kill(tmp_path, job, "60")
    out, err = stop.communicate(timeout=90)
    assert json.loads(out)["state"] == "stopped", err.decode()
    assert not queued(tmp_path, job)  # carried out: nothing left for a later supervisor
    p = cli(["rollback", job, "--to", "fast"], env)
    assert p.returncode == 0, p.stderr.decode()
    assert "runs again" in p.stdout.decode()
    runs_on_fast(tmp_path, job)
    finish(tmp_path, env, job)


def test_a_stop_left_queued_by_a_dead_supervisor_does_not_stop_a_later_rollback(tmp_path, wheelhouse):
    """The stop's wait ends while the supervisor is frozen (the laptop gave up, or was
    killed): the request stays queued and the supervisor is then SIGKILLed. `rollback --to
    fast` revives the job: the newer command supersedes the stop, and the user is told."""
    env = local_env(tmp_path)
    job = training_job(tmp_path, env, wheelhouse)
    stop = stop_then_kill(tmp_path, job, "0.5", gave_up=True)
    out, _ = stop.communicate(timeout=60)
    assert json.loads(out)["state"] == "training"  # it gave up waiting
    assert queued(tmp_path, job)  # the stop outlived its supervisor
    p = cli(["rollback", job, "--to", "fast"], env)
    assert p.returncode == 0, p.stderr.decode()
    said = p.stdout.decode()
    assert "stop" in said and "dropped" in said, said  # what became of the stale stop
    runs_on_fast(tmp_path, job)
    ev = events(jdir(tmp_path, job))
    dropped = [e for e in ev if e["type"] == "request_dropped"]
    assert len(dropped) == 1 and dropped[0]["what"] == "stop", dropped
    assert not [e for e in ev if e["type"] == "state" and e.get("state") == "stopped"]
    # a stop of the earlier run that reaches the queue only now (its writer was slow): the
    # running supervisor drops it, says so in job.log, and the run goes on
    late = jdir(tmp_path, job) / "control" / f"{time.time_ns():020d}-1-stop.json"
    late.write_text(json.dumps({"kind": "stop", "at": time.time() - 5, "run": 0}))
    wait_for(lambda: not late.exists(), 30, what="the late stop to be taken")
    assert state_of(tmp_path, job)["state"] == "training"
    assert len([e for e in events(jdir(tmp_path, job)) if e["type"] == "request_dropped"]) == 2
    assert "of an earlier run of this job was dropped" in (jdir(tmp_path, job) / "job.log").read_text()
    finish(tmp_path, env, job)  # a stop asked now still stops it


def test_a_stop_left_queued_on_a_job_taken_over_is_dropped_by_its_restart(tmp_path, wheelhouse):
    """The stop outlived its supervisor, the trainer died too, and another job took the
    container (the first is settled as ended, never revived): `rollback --to fast` restarts the ended job;
    the stale stop is dropped, and said so, instead of stopping the restarted run."""
    env = local_env(tmp_path)
    job = training_job(tmp_path, env, wheelhouse)
    stop = stop_then_kill(tmp_path, job, "0.5", gave_up=True)
    stop.communicate(timeout=60)
    for pid in trainers_of(tmp_path):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not trainers_of(tmp_path), 20, what="the trainer's end")
    other = job_id_of(cli(["submit", str(tmp_path / "job.yaml")], env, check=True).stdout)
    assert state_of(tmp_path, job)["state"] in ("lost", "failed")  # settled when taken over: never revived
    assert cli(["stop", other], env).returncode == 0
    assert queued(tmp_path, job)
    p = cli(["rollback", job, "--to", "fast"], env)
    assert p.returncode == 0, p.stderr.decode()
    said = p.stdout.decode()
    assert "runs again" in said and "the stop was dropped" in said, said
    runs_on_fast(tmp_path, job)
    finish(tmp_path, env, job)
