"""The stale stop's race (issue 34, left from the stale-stop fix): a `stop` queued for a
supervisor that died before acting on it, and a `gpujob rollback --to` that arrives while
another command (`logs -f`, `status`) has just revived the job. The rollback cannot take
the job's lock then (the revived supervisor holds it), so it cannot drop the stop under
the lock: it queues its request beside the stop. The revived supervisor must take the
newer word (the rollback) and drop the stop, saying so; before the fix the stop won and
the rollback, answered "requested", vanished. Also: a rollback that a stop asked of the
live supervisor overtakes is never dropped silently.

The race is made deterministic with the suite's hold point (``GPUJOB_TEST_HOLD_AT``): the
revived supervisor waits after announcing itself, before it reads its queue, until the
test lets it go. On the `local` kind through the installed entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from helpers import cli, events, local_env, wait_for
from test_faults import jdir, journal_is_sound, state_of, wheelhouse  # noqa: F401 (a fixture)
from test_stale_stop import finish, queued, runs_on_fast, stop_then_kill, training_job
from test_jobs_local import trainers_of


def agent(tmp_path, *args, env=None) -> subprocess.CompletedProcess:
    home = str(tmp_path / "root")
    return subprocess.run([sys.executable, "-m", "gpujob.agent.main", "--home", home, *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=120)


def test_a_rollback_beside_a_revival_by_another_command_drops_the_dead_supervisors_stop(tmp_path,
                                                                                       wheelhouse):
    env = local_env(tmp_path)
    job = training_job(tmp_path, env, wheelhouse)
    dead = state_of(tmp_path, job)["supervisor_pid"]
    stop = stop_then_kill(tmp_path, job, "0.5", gave_up=True)
    out, _ = stop.communicate(timeout=60)
    assert json.loads(out)["state"] == "training"  # it gave up waiting: the stop stays queued
    assert queued(tmp_path, job)
    gate = tmp_path / "gate"
    gate.touch()
    # another command (here the agent's `status`, as `gpujob status` and `logs -f` do) revives
    # the job; its supervisor holds before it reads its queue
    p = agent(tmp_path, "status", job, env=dict(os.environ, GPUJOB_TEST_HOLD_AT=f"announced@{gate}"))
    assert p.returncode == 0, p.stderr.decode()
    wait_for(lambda: state_of(tmp_path, job).get("supervisor_pid") not in (None, dead), 30,
             what="the revived supervisor")
    try:
        p = cli(["rollback", job, "--to", "fast"], env)  # the job's lock is the revived supervisor's
        assert p.returncode == 0, p.stderr.decode()
        assert queued(tmp_path, job)  # the stop is still there: nobody could drop it under the lock
    finally:
        gate.unlink()
    runs_on_fast(tmp_path, job)  # the rollback was carried out, and no stop took it
    ev = events(jdir(tmp_path, job))
    dropped = [e for e in ev if e["type"] == "request_dropped"]
    assert [d["what"] for d in dropped] == ["stop"], dropped
    assert not [e for e in ev if e["type"] == "state" and e.get("state") == "stopped"]
    assert "of an earlier run of this job was dropped" in (jdir(tmp_path, job) / "job.log").read_text()
    finish(tmp_path, env, job)  # a stop asked of the running supervisor still stops it


def test_a_rollback_overtaken_by_a_stop_of_the_live_supervisor_is_dropped_on_record(tmp_path, wheelhouse):
    """A stop asked of the supervisor that runs still wins over a rollback asked after it;
    the rollback the user was told is "requested" is then dropped with an event and a line
    in job.log, never silently."""
    env = local_env(tmp_path)
    job = training_job(tmp_path, env, wheelhouse)
    sup = state_of(tmp_path, job)["supervisor_pid"]
    os.kill(sup, signal.SIGSTOP)  # both requests are queued before it reads either
    try:
        p = agent(tmp_path, "stop", job, "--wait", "0.2", env=dict(os.environ))
        assert json.loads(p.stdout)["state"] == "training", p.stderr.decode()
        p = cli(["rollback", job, "--to", "fast"], env)
        assert p.returncode == 0, p.stderr.decode()
        assert len(list((jdir(tmp_path, job) / "control").glob("*.json"))) == 2
    finally:
        os.kill(sup, signal.SIGCONT)
    wait_for(lambda: state_of(tmp_path, job).get("state") == "stopped", 60, what="the stop")
    assert not trainers_of(tmp_path)
    ev = events(jdir(tmp_path, job))
    dropped = [e for e in ev if e["type"] == "request_dropped"]
    assert [d["what"] for d in dropped] == ["rollback"], dropped
    assert "stopped" in dropped[0]["why"]
    said = (jdir(tmp_path, job) / "job.log").read_text()
    assert "was not carried out: the job ended (stopped) first" in said
    assert not list((jdir(tmp_path, job) / "control").glob("*.json"))
    journal_is_sound(jdir(tmp_path, job))


def test_a_stop_and_a_rollback_asked_of_one_supervisor_that_then_died_keep_their_order(tmp_path,
                                                                                      wheelhouse):
    """Both asked of the same supervisor, which dies before acting on either: the revived
    one does what that supervisor would have done (the stop wins; the rollback dropped on
    record). Only a rollback asked after the stop's supervisor was gone supersedes it."""
    env = local_env(tmp_path)
    job = training_job(tmp_path, env, wheelhouse)
    sup = state_of(tmp_path, job)["supervisor_pid"]
    os.kill(sup, signal.SIGSTOP)
    try:
        p = agent(tmp_path, "stop", job, "--wait", "0.2", env=dict(os.environ))
        assert json.loads(p.stdout)["state"] == "training", p.stderr.decode()
        p = cli(["rollback", job, "--to", "fast"], env)
        assert p.returncode == 0, p.stderr.decode()
    finally:
        os.kill(sup, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{sup}") or
             open(f"/proc/{sup}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 10,
             what="the killed supervisor to be gone")
    p = agent(tmp_path, "status", job)  # revives it, as `gpujob status` and `logs -f` do
    assert p.returncode == 0, p.stderr.decode()
    wait_for(lambda: state_of(tmp_path, job).get("state") == "stopped", 60, what="the stop")
    ev = events(jdir(tmp_path, job))
    assert [d["what"] for d in ev if d["type"] == "request_dropped"] == ["rollback"]
    assert not list((jdir(tmp_path, job) / "control").glob("*.json"))
    wait_for(lambda: not trainers_of(tmp_path), 20, what="nothing of the job left running")
