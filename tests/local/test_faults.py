"""Fault injection on the `local` target: a process dies (supervisor, uv, trainer),
the disk fills, the laptop's clock steps back, two requests race. After each, the
checks are the same: at most one trainer, a clear final state, a journal that
parses, no lost or doubled log line, and gpujob can finish the job.
(The container and sshd faults run on the test bed: tests/bed/test_jobs_testbed.py.)"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from gpujob.agent.base.fsio import read_records
from gpujob.agent.base.proc import group_pids
from gpujob.ops.wheelhouse import build_indexes
from helpers import cli, cli_json, events, job_id_of, local_env, wait_for, write_spec
from test_jobs_local import trainers_of


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheelhouse")
    idx = build_indexes(root)
    return root, {b: p.as_uri() for b, p in idx.items()}


class GatedIndex:
    """The wheelhouse over loopback HTTP; while the gate is shut every request
    waits (an install that hangs on a slow mirror)."""

    def __init__(self, root: Path):
        gate = self.gate = threading.Event()

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def do_GET(self):
                gate.wait(60)
                super().do_GET()

            def log_message(self, *a):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.gate.set()
        self.server.shutdown()


@pytest.fixture
def gated(wheelhouse):
    g = GatedIndex(wheelhouse[0])
    yield g
    g.close()


@pytest.fixture
def env(tmp_path):
    return local_env(tmp_path)


def state_of(tmp_path, job_id) -> dict:
    try:
        return json.loads((tmp_path / "root" / "jobs" / job_id / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def jdir(tmp_path, job_id) -> Path:
    return tmp_path / "root" / "jobs" / job_id


def submit(spec, env, *extra) -> str:
    return job_id_of(cli(["submit", str(spec), *extra], env, check=True).stdout)


def journal_is_sound(d: Path) -> list:
    """The journal parses whole; returns its events."""
    json.loads((d / "state.json").read_text())
    records, skipped = read_records(str(d / "events.jsonl"))
    assert skipped == 0
    return records


def submit_training(tmp_path, env, wheelhouse) -> str:
    """A long trainer on fast (no throughput judging, no warmup), submitted and seen in its
    train phase: the job id."""
    urls = wheelhouse[1]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.05")
    job_id = submit(spec, env)
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("phase") == "train", 60,
             what="the trainer")
    return job_id


def group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the group."""
    return bool(group_pids(pgid))


def submit_gated_install(tmp_path, env, wheelhouse, gated) -> tuple:
    """Submit a job whose `fast` install hangs on the gated index; return (spec, job_id,
    the uv install's process group) once uv runs. The banner is written before the
    command's keeper records its group, so wait for both."""
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=f"{gated.url}/fast/simple",
                      slow_url=wheelhouse[1]["slow"], profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 3 --interval 0.01")
    job_id = submit(spec, env)
    log = jdir(tmp_path, job_id) / "job.log"
    wait_for(lambda: log.exists() and "pip install" in log.read_text()
             and (state_of(tmp_path, job_id).get("child") or {}).get("pgid"), 30, what="uv pip install")
    return spec, job_id, state_of(tmp_path, job_id)["child"]["pgid"]


def test_supervisor_killed_during_install_the_old_uv_is_ended_before_a_new_one(tmp_path, env, wheelhouse,
                                                                               gated):
    spec, job_id, old = submit_gated_install(tmp_path, env, wheelhouse, gated)
    st = state_of(tmp_path, job_id)
    assert st["child"]["phase"] == "prepare"
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    # a resubmit is refused while the old install runs: never two uv in one venv
    p = cli(["submit", str(spec)], env)
    assert p.returncode == 5 and "prepare command still runs" in p.stderr.decode(), p.stderr.decode()
    assert group_alive(old)
    # status restarts the supervisor; it ends the old install's whole group, then installs anew
    cli(["status", job_id], env, check=True)
    wait_for(lambda: any(e["type"] == "install_ended" for e in events(jdir(tmp_path, job_id))), 20,
             what="the old install to be ended")
    assert not group_alive(old)
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("pgid") not in (None, old), 20,
             what="a new install")
    gated.gate.set()
    wait_for(lambda: state_of(tmp_path, job_id).get("state") == "succeeded", 60, what="success")
    ev = journal_is_sound(jdir(tmp_path, job_id))
    assert [e["type"] for e in ev].count("env_ready") == 1


def test_supervisor_killed_mid_rollback_the_next_one_finishes_it(tmp_path, env, wheelhouse, gated):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=f"{gated.url}/fast/simple",
                      slow_url=wheelhouse[1]["slow"], profile="slow", warmup=False,
                      trainer_args="--steps 40 --interval 0.05", rollback={"fallback": ["fast"]})
    job_id = submit(spec, env)
    wait_for(lambda: state_of(tmp_path, job_id).get("step") == "rollback" and
             (state_of(tmp_path, job_id).get("child") or {}).get("phase") == "prepare", 60,
             what="the rollback's install of fast")
    st = state_of(tmp_path, job_id)
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    assert cli_json(["status", job_id, "--json"], env)["state"] in ("rolling_back", "lost")
    # `rollback --to fast` is not refused: the job is finished by a new supervisor
    p = cli(["rollback", job_id, "--to", "fast"], env)
    assert p.returncode == 0, p.stderr.decode()
    gated.gate.set()
    wait_for(lambda: state_of(tmp_path, job_id).get("state") in ("succeeded", "failed"), 60, what="the end")
    st = state_of(tmp_path, job_id)
    assert st["state"] == "succeeded" and st["profile"] == "fast", st.get("reason")
    ev = journal_is_sound(jdir(tmp_path, job_id))
    assert [e["type"] for e in ev].count("rollback") == 1  # decided once, finished by the next supervisor
    assert len(st["rollbacks"]) == 1 and st["rollbacks"][0]["to"] == "fast"
    assert "resumed from checkpoint" in (jdir(tmp_path, job_id) / "job.log").read_text()


def test_rollback_then_stop_in_20_interleavings_the_stop_always_wins(tmp_path, env, wheelhouse):
    urls = wheelhouse[1]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.05")
    agent = [sys.executable, "-m", "gpujob.agent.main", "--home", str(tmp_path / "root")]
    outcomes = []
    for i in range(20):
        job_id = submit(spec, env)
        wait_for(lambda: state_of(tmp_path, job_id).get("state") == "training", 60, what="training")
        # the stop lands anywhere in the rollback: queued behind it, during the switch of
        # venvs, while the new trainer starts (the switch takes ~0.5-1 s here)
        delay = i * 0.05
        first, second = (["rollback", job_id, "--to", "slow"], ["stop", job_id, "--wait", "60"])
        a = subprocess.Popen(agent + first, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        b = subprocess.Popen(agent + second, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        a.wait(90)
        b.wait(90)
        wait_for(lambda: state_of(tmp_path, job_id).get("state") in ("stopped", "succeeded", "failed"), 60,
                 what=f"interleaving {i} to end")
        st = state_of(tmp_path, job_id)
        outcomes.append(st["state"])
        assert st["state"] == "stopped", (i, st.get("reason"))
        assert not trainers_of(tmp_path), i
        journal_is_sound(jdir(tmp_path, job_id))
        assert not list((jdir(tmp_path, job_id) / "control").glob("*.json"))  # nothing left unacted
    assert outcomes == ["stopped"] * 20


@pytest.fixture
def small_root(tmp_path):
    """The local target's home on a 3 MiB tmpfs: a disk that fills."""
    root = tmp_path / "root"
    root.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(root)], capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    yield root
    subprocess.run(["umount", "-l", str(root)])


def test_disk_full_while_training_ends_the_job_clearly(tmp_path, env, wheelhouse, small_root):
    code = tmp_path / "code"
    code.mkdir()
    (code / "filler.py").write_text(
        "import sys, time\nline = 'x' * 4000\nfor i in range(100000):\n"
        "    print(f'step {i} | {line}', flush=True)\n    time.sleep(0.001)\n")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=wheelhouse[1]["fast"],
                      slow_url=wheelhouse[1]["slow"], profile="fast", throughput=False, warmup=False,
                      sync=[{"src": str(code), "dest": "."}], train={"command": "python filler.py"})
    job_id = submit(spec, env)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") in ("failed", "succeeded", "stopped"), 60,
             what="the job to end")
    st = cli_json(["status", job_id, "--json"], env)
    assert st["state"] == "failed" and st["reason"].startswith("no space left on device in "), st["reason"]
    assert str(small_root) in st["reason"]
    journal_is_sound(jdir(tmp_path, job_id))
    assert not trainers_of(tmp_path)
    assert "filler.py" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_clock_step_on_the_laptop_changes_no_default_job(tmp_path, env, wheelhouse):
    urls = wheelhouse[1]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 2 --interval 0.01")
    older = job_id_of(cli(["submit", str(spec), "--follow"], env, check=True).stdout)
    spec2 = write_spec(tmp_path / "job2.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                       profile="fast", throughput=False, warmup=False,
                       trainer_args="--steps 100000 --interval 0.1")
    newer = submit(spec2, env)
    # the laptop's clock had stepped back an hour when `newer` was recorded
    db = sqlite3.connect(str(tmp_path / "state" / "gpujob" / "state.db"))
    with db:
        db.execute("UPDATE jobs SET submitted_at = submitted_at + 3600 WHERE job_id = ?", (older,))
    db.close()
    st = cli_json(["status", "--json"], env)
    assert st["job"] == newer and st["uptime_s"] >= 0
    assert cli_json(["ps", "--json"], env)[0]["job"] == newer
    out = cli(["stop"], env, check=True).stdout.decode()
    assert out.startswith(f"{newer}: stopped")


def test_a_job_id_the_laptop_knows_is_refused_before_anything_starts(tmp_path, wheelhouse):
    env = local_env(tmp_path)
    hosts = tmp_path / "two.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
        "box": {"root": str(tmp_path / "root")}, "box2": {"root": str(tmp_path / "root2")}}}}}))
    env["GPUJOB_HOSTS"] = str(hosts)
    urls = wheelhouse[1]
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 2 --interval 0.01")
    cli(["submit", str(spec), "--job-id", "same-1", "--follow"], env, check=True)
    p = cli(["submit", str(spec), "--job-id", "same-1", "--target", "box2"], env)
    assert p.returncode == 5 and "same-1 is already taken" in p.stderr.decode()
    assert "Traceback" not in p.stderr.decode() and len(p.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "root2" / "jobs").exists()  # nothing started on box2
    assert cli_json(["status", "same-1", "--json"], env)["target"] == "lab/box"


def test_uv_killed_mid_install_fails_the_job_clearly_and_leaves_no_partial_venv(tmp_path, env, wheelhouse,
                                                                                 gated):
    spec, job_id, pgid = submit_gated_install(tmp_path, env, wheelhouse, gated)
    os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") == "failed", 30, what="the failure")
    st = state_of(tmp_path, job_id)
    assert st["reason"].startswith("installing profile fast failed (uv exit -9)"), st["reason"]
    assert not list((tmp_path / "root" / "envs").glob("fast-*"))  # the partial venv is gone
    journal_is_sound(jdir(tmp_path, job_id))
    gated.gate.set()  # the mirror answers again: the same spec installs and runs
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0 and "job succeeded" in p.stdout.decode(), p.stdout.decode()[-1000:]


def test_a_supervisor_dying_between_starting_the_trainer_and_writing_it_down(tmp_path, env, wheelhouse):
    """The narrowest window: the trainer runs but state.json does not name it yet (only
    `child_starting`). The next supervisor finds it by its keeper and adopts it: never a
    second trainer."""
    job_id = submit_training(tmp_path, env, wheelhouse)
    wait_for(lambda: trainers_of(tmp_path), 10, what="the trainer process")
    st = state_of(tmp_path, job_id)
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    # make the state what it is for an instant at every start: the child not yet written down
    from gpujob.agent.base.fsio import write_json
    child = st.pop("child")
    st["child_starting"] = {k: child[k] for k in ("phase", "log", "started_at", "boot", "exit_file",
                                                  "log_start", "profile", "gpu", "watch_tps")}
    write_json(str(jdir(tmp_path, job_id) / "state.json"), st)
    trainer = trainers_of(tmp_path)
    cli(["status", job_id], env, check=True)  # restarts the supervisor
    wait_for(lambda: any(e["type"] == "found_started" for e in events(jdir(tmp_path, job_id))), 20,
             what="the running trainer to be found")
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("pgid") == child["pgid"], 10,
             what="its adoption")
    time.sleep(1.0)
    assert trainers_of(tmp_path) == trainer  # the same one, and only it
    cli(["stop", job_id], env, check=True)
    assert not trainers_of(tmp_path) and state_of(tmp_path, job_id)["state"] == "stopped"


def test_a_trainer_that_finishes_after_its_supervisor_died_is_succeeded_not_lost(tmp_path, env, wheelhouse):
    """The supervisor dies; the trainer then exits 0 (its keeper records it) before any
    supervisor is back; a resubmit takes the container: the first job follows its trainer's
    recorded exit, and its job.log gets the lines the dead relay had not copied."""
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=wheelhouse[1]["fast"],
                      slow_url=wheelhouse[1]["slow"], profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 30 --interval 0.1")
    first = submit(spec, env)
    wait_for(lambda: (state_of(tmp_path, first).get("child") or {}).get("phase") == "train", 60,
             what="training")
    os.kill(state_of(tmp_path, first)["supervisor_pid"], signal.SIGKILL)
    exit_file = Path(state_of(tmp_path, first)["child"]["exit_file"])
    wait_for(exit_file.exists, 30, what="the trainer's keeper to record its exit")
    second = submit(spec, env)
    st = state_of(tmp_path, first)
    assert st["state"] == "succeeded" and st["step"] == "succeeded" and st["exit_code"] == 0, st.get("reason")
    assert f"job {second} took the container" in st["reason"]
    log = (jdir(tmp_path, first) / "job.log").read_text()
    assert [ln.split()[1] for ln in log.splitlines() if ln.startswith("step ")][-1] == "30"
    assert cli_json(["status", first, "--json"], env)["state"] == "succeeded"
    wait_for(lambda: state_of(tmp_path, second).get("state") == "succeeded", 60, what="the second job")


def test_a_supervisor_killed_mid_confirmation_the_next_one_finishes_it(tmp_path, env, wheelhouse):
    """slow breaches and rolls back to fast; slow is only a suspect (kept in state.json) until
    fast has held for rollback.confirm. The supervisor is killed in between: the next one
    goes on confirming and marks slow bad."""
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=wheelhouse[1]["fast"],
                      slow_url=wheelhouse[1]["slow"], profile="slow", warmup=False,
                      trainer_args="--steps 2000 --interval 0.05", rollback={"confirm": "4s"})
    cli(["ledger", "set", "box", "tjob", "fast", "good"], env, check=True)
    job_id = submit(spec, env)
    wait_for(lambda: (state_of(tmp_path, job_id).get("suspect") or {}).get("target") == "fast" and
             (state_of(tmp_path, job_id).get("child") or {}).get("profile") == "fast", 90,
             what="the rollback to fast, slow a suspect")
    st = state_of(tmp_path, job_id)
    led = json.loads((tmp_path / "root" / "ledger" / "tjob.json").read_text())
    assert led["profiles"].get("slow", {}).get("status") != "bad"  # not yet: fast must recover first
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    cli(["status", job_id], env, check=True)  # a new supervisor re-adopts fast's trainer
    wait_for(lambda: json.loads((tmp_path / "root" / "ledger" / "tjob.json").read_text())["profiles"]
             .get("slow", {}).get("status") == "bad", 60, what="slow marked bad after fast held")
    ev = journal_is_sound(jdir(tmp_path, job_id))
    kinds = [e["type"] for e in ev]
    assert kinds.count("suspect_confirmed") == 1 and "supervisor_revived" in kinds
    assert state_of(tmp_path, job_id).get("suspect") is None
    cli(["stop", job_id], env, check=True)
