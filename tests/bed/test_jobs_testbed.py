"""Jobs on the loopback Proxmox test bed: ssh → pct → a real LXC container, with
wheel profiles installed by uv (shipped by gpujob: the container has none) from a
real package index served over HTTP on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers import cli, cli_json, gpujob_argv, job_id_of, wait_for, write_spec

pytestmark = pytest.mark.testbed


@pytest.fixture
def bed_env(testbed, tmp_path, request):
    """An inventory whose container home is private to this test."""
    home = f"/root/gj-{request.node.name[:40]}"
    inv = {"hosts": {"tb": {"address": "127.0.0.1", "port": testbed.port, "user": "root",
                            "identity_file": str(testbed.user_key), "known_hosts": str(testbed.known_hosts),
                            "containers": {"ct200": {"vmid": 200, "home": home}}}}}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(inv))
    env = dict(os.environ)
    env.update(GPUJOB_HOSTS=str(tmp_path / "hosts.yaml"), XDG_STATE_HOME=str(tmp_path / "state"),
               COLUMNS="200")
    env["GPUJOB_TEST_HOME"] = home
    yield env
    testbed.container_exec("rm", "-rf", home)


def home_path(testbed, env, *parts) -> Path:
    return testbed.container_path(os.path.join(env["GPUJOB_TEST_HOME"], *parts))


def status(job_id, env) -> dict:
    return cli_json(["status", job_id, "--json"], env)


def steps_of(text: str) -> list[int]:
    return [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("step ")]


def test_submit_follow_resubmit_and_rollback_on_the_bed(testbed, bed_env, tmp_path, index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", trainer_args="--steps 40 --interval 0.05",
                      rollback={"confirm": "0s"})  # slow is marked bad at fast's first ok window
    p = cli(["submit", str(spec), "--follow"], env, timeout=300)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-2000:]
    assert steps_of(p.stdout.decode()) == list(range(1, 41))
    assert "building venv" in p.stdout.decode()
    first = job_id_of(p.stdout)
    assert status(first, env)["state"] == "succeeded"
    assert home_path(testbed, env, "bin", "uv").exists()  # shipped: the container had none
    # resubmit: nothing to install, nothing to ship, no warmup (cache warm)
    p = cli(["submit", str(spec), "--follow"], env, timeout=300)
    assert p.returncode == 0
    assert "already installed, reusing it" in p.stdout.decode() and "building venv" not in p.stdout.decode()
    assert "0 of " in p.stderr.decode()
    # the slow build: rolled back to fast (known-good now), training resumed
    p = cli(["submit", str(spec), "--profile", "slow", "--follow"], env, timeout=300)
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    st = status(job_id_of(p.stdout), env)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    [rb] = st["rollbacks"]
    assert (rb["from"], rb["to"], rb["signal"]) == ("slow", "fast", "low_throughput")
    assert st["ledger"]["slow"]["status"] == "bad" and st["ledger"]["fast"]["status"] == "good"
    assert st["window_median"] >= 10000
    assert "resumed from checkpoint" in p.stdout.decode()
    envs = sorted(d.name.split("-")[0] for d in home_path(testbed, env, "envs").iterdir())
    assert envs == ["fast", "slow"]
    profiles = cli(["profiles", "ct200"], env, check=True).stdout.decode()
    assert "fast" in profiles and "slow" in profiles and "bad" in profiles


@pytest.mark.parametrize("path", ["kept", "direct"])
def test_controller_sigkill_and_ten_cut_connections(testbed, bed_env, tmp_path, index, path):
    """The laptop dies mid-training; then `logs -f` is followed while the link is cut 10 times:
    every byte once, in order. On the direct path each cut is one notice; through the kept
    connection a cut that lands while its daemon is still reconnecting from the last one is
    the same loss (it is seen when the call resumes), so only the bytes are counted there."""
    env = dict(bed_env, GPUJOB_NO_DAEMON="1") if path == "direct" else bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 150 --interval 0.08")
    proc = subprocess.Popen([*gpujob_argv(), "submit", str(spec), "--follow"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    jobs = home_path(testbed, env, "jobs")
    wait_for(lambda: jobs.exists()
             and any((d / "train.log").exists() and "step 2 " in (d / "train.log").read_text()
                                           for d in jobs.iterdir()), 120, what="training")
    proc.send_signal(signal.SIGKILL)  # the laptop dies mid-training
    proc.wait()
    job_id = next(jobs.iterdir()).name
    assert status(job_id, env)["state"] == "training"
    # follow it from scratch while the connection is cut 10 times
    follower = subprocess.Popen([*gpujob_argv(), "logs", "-f", job_id],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cuts = 0
    while cuts < 10 and follower.poll() is None:
        time.sleep(0.7)
        cuts += bool(testbed.kill_ssh_sessions())
    out, err = follower.communicate(timeout=120)
    assert cuts == 10
    assert follower.returncode == 0, err.decode()
    # every cut was noticed: as a lost connection, or (cut mid-reconnect) as a failed reconnect
    notices = err.decode().count("connection lost") + err.decode().count("reconnect failed")
    assert notices >= (10 if path == "direct" else 1), err.decode()
    assert steps_of(out.decode()) == list(range(1, 151))  # each line once, in order
    assert status(job_id, env)["state"] == "succeeded"
    tail = cli(["logs", job_id, "--phase", "train", "--tail", "3"], env, check=True).stdout.decode()
    assert steps_of(tail) == [149, 150] and tail.endswith("training finished at step 150\n")


def test_busy_refused_stop_leaves_nothing_and_plan_runs_nothing(testbed, bed_env, tmp_path, index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.1")
    sshd_log = [p for p in testbed.ssh_dir.rglob("sshd.log")][0]
    before = sshd_log.read_text().count("Accepted publickey")
    plan = cli(["submit", str(spec), "--plan"], env)
    assert plan.returncode == 0 and b"pct exec 200 --" in plan.stdout
    time.sleep(0.3)
    assert sshd_log.read_text().count("Accepted publickey") == before  # not even a login
    assert not home_path(testbed, env).exists()
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True, timeout=300).stdout)
    wait_for(lambda: status(job_id, env)["state"] == "training", 120, what="training")
    busy = cli(["submit", str(spec)], env)
    assert busy.returncode == 5 and f"container busy: job {job_id}" in busy.stderr.decode()
    pgid = status_raw(testbed, env, job_id)["child_pgid"]
    assert cli(["stop", job_id], env).returncode == 0
    assert status(job_id, env)["state"] == "stopped"
    ps = testbed.container_exec("ps", "-eo", "pgid,args").stdout.decode().splitlines()[1:]
    assert not [ln for ln in ps if ln.split()[0] == str(pgid)]
    assert not [ln for ln in ps if job_id in ln]  # nor its supervisor


def status_raw(testbed, env, job_id) -> dict:
    return json.loads(home_path(testbed, env, "jobs", job_id, "state.json").read_text())


def test_a_cut_connection_leaves_no_tail_behind_on_a_quiet_log(testbed, bed_env, tmp_path, index):
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", throughput=False, warmup=False, trainer_args="--steps 3 --interval 60")
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True, timeout=300).stdout)
    wait_for(lambda: status(job_id, env)["state"] == "training", 120, what="training")
    follower = subprocess.Popen([*gpujob_argv(), "logs", "-f", job_id],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def tails():
        return [ln for ln in testbed.container_exec("ps", "-eo", "args").stdout.decode().splitlines()
                if f" tail {job_id} " in ln]
    try:
        wait_for(lambda: len(tails()) == 1, 30, what="the follower's tail")
        for _ in range(3):
            assert testbed.kill_ssh_sessions()
            time.sleep(1.5)
        assert len(tails()) == 1, tails()  # only the reconnected follower's; the cut ones left
    finally:
        follower.kill()
        cli(["stop", job_id], env)


def _container_trainers(testbed) -> list[str]:
    ps = testbed.container_exec("ps", "-eo", "pid,stat,args").stdout.decode().splitlines()
    return [ln for ln in ps if "trainer.py" in ln and "bash -c" not in ln and "-E -s -c" not in ln
            and " Z" not in ln]


def test_sshd_restart_and_container_restart_the_job_goes_on(testbed, bed_env, tmp_path, index):
    """Faults on the host: sshd restarts (the job does not notice), then the container
    restarts (everything in it dies): the next `status` gives the job a new supervisor,
    which finds its trainer gone and restarts it on the same profile from its checkpoint."""
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.05",
                      train={"command": "python trainer.py --steps 100000 --interval 0.05",
                             "resume_args": ["--resume"], "grace": "3s",
                             "restarts": {"max": 2, "on": ["crash", "oom_killed"]}})
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True, timeout=300).stdout)
    wait_for(lambda: status(job_id, env)["state"] == "training", 120, what="training")
    wait_for(lambda: len(_container_trainers(testbed)) == 1, 30, what="the trainer")
    pgid = json.loads(home_path(testbed, env, "jobs", job_id, "state.json").read_text())["child"]["pgid"]
    testbed.restart_sshd(0)
    st = status(job_id, env)
    assert st["state"] == "training" and _container_trainers(testbed)
    state = json.loads(home_path(testbed, env, "jobs", job_id, "state.json").read_text())
    assert state["child"]["pgid"] == pgid
    testbed.restart_container()
    assert not _container_trainers(testbed)
    p = cli(["status", job_id], env, check=True)
    assert "restarted its supervisor" in p.stderr.decode()
    log = home_path(testbed, env, "jobs", job_id, "job.log")
    wait_for(lambda: "resumed from checkpoint" in log.read_text(), 60, what="the resume")
    st = status(job_id, env)
    assert st["state"] == "training"
    raw = json.loads(home_path(testbed, env, "jobs", job_id, "state.json").read_text())
    assert len(raw["restarts"]) == 1 and "exit status unknown" in raw["restarts"][0]["reason"]
    time.sleep(0.5)
    assert len(_container_trainers(testbed)) == 1
    cli(["stop", job_id], env, check=True)
    assert status(job_id, env)["state"] == "stopped" and not _container_trainers(testbed)


def test_resume_after_reboot_brings_the_job_back_without_the_laptop(testbed, bed_env, tmp_path, index):
    """A job marked resume_after_reboot: the container restarts, and with no gpujob
    command from the laptop the job trains again from its checkpoint (its boot hook in
    /etc/rc.local); the hook goes when the job ends."""
    env = bed_env
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="fast", throughput=False, warmup=False, resume_after_reboot=True,
                      trainer_args="--steps 100000 --interval 0.05")
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True, timeout=300).stdout)
    wait_for(lambda: status(job_id, env)["state"] == "training", 120, what="training")
    rc_local = testbed.container_path("/etc/rc.local")
    assert f"gpujob-boot {env['GPUJOB_TEST_HOME']}" in rc_local.read_text()
    log = home_path(testbed, env, "jobs", job_id, "job.log")
    wait_for(lambda: "step 5 " in log.read_text(), 60, what="some steps")
    testbed.restart_container()
    wait_for(lambda: "resumed from checkpoint" in log.read_text(), 60, what="the job to come back by itself")
    raw = json.loads(home_path(testbed, env, "jobs", job_id, "state.json").read_text())
    assert raw["state"] == "training" and raw["restarts"][-1]["signal"] == "container_restart"
    wait_for(lambda: len(_container_trainers(testbed)) == 1, 30, what="one trainer")
    cli(["stop", job_id], env, check=True)
    assert status(job_id, env)["state"] == "stopped"
    assert f"gpujob-boot {env['GPUJOB_TEST_HOME']}" not in rc_local.read_text()


def test_a_trainer_that_only_writes_a_metrics_file_is_rolled_back_on_the_bed(testbed, bed_env, tmp_path,
                                                                             index):
    from test_sources import QUIET
    code = tmp_path / "code"
    code.mkdir()
    (code / "t.py").write_text(QUIET)
    tp = {"source": "file", "path": "metrics.jsonl", "field": "perf.tokens_per_sec", "step_field": "step",
          "window": 3, "min": "10K", "failure_limit": 2, "good_after": "1s", "no_data_timeout": "30s"}
    job = None
    for name, profile, steps in (("a.yaml", "fast", 40), ("b.yaml", "slow", 60)):
        spec = write_spec(tmp_path / name, target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                          profile=profile, warmup=False, sync=[{"src": str(code), "dest": "."}],
                          train={"command": f"python t.py {steps}", "resume_args": ["--resume"],
                                 "grace": "2s"},
                          throughput=tp)
        p = cli(["submit", str(spec), "--follow"], bed_env, timeout=300)
        assert p.returncode == 0, p.stdout.decode()[-2000:]
        job = job_id_of(p.stdout)
    st = status(job, bed_env)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    assert [(r["from"], r["to"], r["signal"]) for r in st["rollbacks"]] == [("slow", "fast",
                                                                             "low_throughput")]
    assert not home_path(testbed, bed_env, "jobs", job, "train.log").read_text().strip()
