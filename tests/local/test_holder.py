"""Several laptops, one box: a busy container says who holds it (user@laptop, job,
since when), also once the holder's supervisor died; `ps --all TARGET` shows the
container's jobs that other laptops started, read from its journal."""

from __future__ import annotations

import json
import os
import signal
import socket


from helpers import cli, cli_json, job_id_of, local_env, wait_for, write_spec


def laptop(tmp_path, user: str) -> dict:
    """Another laptop: its own index (state dir) and login name, the same box."""
    env = local_env(tmp_path)
    env.update(XDG_STATE_HOME=str(tmp_path / f"state-{user}"), USER=user, LOGNAME=user)
    return env


def error_line(p) -> str:
    """The one error line (progress lines start with '·')."""
    text = p.stderr.decode()
    lines = [ln for ln in text.splitlines() if not ln.startswith("·")]
    assert "Traceback" not in text and len(lines) == 1, text
    return lines[0]


def test_a_busy_box_names_its_holder_and_ps_all_shows_other_laptops_jobs(tmp_path, index_urls):
    alice, bob = laptop(tmp_path, "alice"), laptop(tmp_path, "bob")
    host = socket.gethostname().split(".")[0]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.05")
    job = job_id_of(cli(["submit", str(spec)], alice, check=True).stdout)
    lock = json.loads((tmp_path / "root" / "lock.json").read_text())
    assert lock["job_id"] == job and lock["by"] == f"alice@{host}"
    wait_for(lambda: cli_json(["status", job, "--json"], alice)["state"] == "training", 60, what="training")

    p = cli(["submit", str(spec)], bob)
    err = error_line(p)
    assert p.returncode == 5
    assert (f"container busy: job {job} of alice@{host}, since " in err and " UTC (" in err
            and " ago) holds it" in err)

    assert cli_json(["ps", "--json"], bob) == []  # bob's laptop started nothing
    views = cli_json(["ps", "--all", "box", "--json"], bob)
    assert [(v["job"], v["by"], v["mine"], v["state"]) for v in views] == [(job, f"alice@{host}", False,
                                                                            "training")]
    table = cli(["ps", "--all", "box"], bob, check=True).stdout.decode()
    assert job in table and f"alice@{host}" in table
    assert f"alice@{host} (you)" in cli(["ps", "--all", "box"], alice, check=True).stdout.decode()
    p = cli(["ps", "--all"], bob)
    assert p.returncode == 2 and "gpujob ps --all TARGET" in p.stderr.decode()

    # the holder's supervisor dies (its trainer runs on): the refusal still says whose job it is
    pid = json.loads((tmp_path / "root" / "jobs" / job / "state.json").read_text())["supervisor_pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             30, what="the supervisor to die")
    p = cli(["submit", str(spec)], bob)
    err = error_line(p)
    assert (p.returncode == 5 and f"job {job} of alice@{host} has no supervisor but its train command still "
                                  f"runs" in err)
    # ps --all only looks: it restarts no supervisor
    assert cli_json(["ps", "--all", "box", "--json"], bob)[0]["job"] == job
    assert json.loads((tmp_path / "root" / "jobs" / job / "state.json").read_text())["supervisor_pid"] == pid
    cli(["stop", job, "-t", "lab/box"], bob, check=True)  # bob may end it, naming it
    assert cli_json(["status", job, "--json", "-t", "lab/box"], bob)["state"] == "stopped"
