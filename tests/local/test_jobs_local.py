"""The job lifecycle and automatic rollback on the `local` target (the embedded
default): the real CLI, the real supervisor, real venvs built by uv from real
wheel indexes on disk. Only the GPUs are absent (and, for gpu_idle, mocked)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import HANG, cli, cli_json, events, gpujob_argv, job_id_of, local_env, wait_for, write_spec


@pytest.fixture
def env(tmp_path):
    return local_env(tmp_path)


def journal(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "root" / "jobs" / job_id


def submit(spec: Path, env: dict, *extra: str) -> str:
    p = cli(["submit", str(spec), *extra], env, check=True)
    return job_id_of(p.stdout)


def status(job_id: str, env: dict) -> dict:
    return cli_json(["status", job_id, "--json"], env)


def test_submit_follow_prints_every_line_once_and_succeeds(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast",
                      trainer_args="--steps 25 --interval 0.05")
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    text = p.stdout.decode()
    steps = [ln for ln in text.splitlines() if ln.startswith("step ")]
    assert [int(ln.split()[1]) for ln in steps] == list(range(1, 26))
    assert "succeeded" in text
    job_id = job_id_of(p.stdout)
    st = status(job_id, env)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    # the raw phase logs exist beside the combined one
    j = journal(tmp_path, job_id)
    assert (j / "train.log").read_text().count("step 25 |") == 1
    assert "warmup on GPU 3" in (j / "warmup.log").read_text()
    # caches are per profile: the warmup wrote into fast's inductor dir only
    caches = list((tmp_path / "root" / "caches").iterdir())
    assert [c.name.split("-")[0] for c in caches] == ["fast"]
    assert list((caches[0] / "inductor").iterdir())


def test_resubmit_installs_nothing_and_ships_only_changed_files(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", trainer_args="--steps 2 --interval 0.01")
    first = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert first.returncode == 0, first.stderr.decode()
    second = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert second.returncode == 0, second.stderr.decode()
    assert "0 of " in second.stderr.decode()  # sync: nothing changed, nothing moved
    ev = events(journal(tmp_path, job_id_of(second.stdout)))
    assert any(e["type"] == "env_reused" for e in ev)
    assert not any(e["type"] == "env_build" for e in ev)
    assert not any(e["type"] == "phase" and e["phase"] == "warmup" for e in ev)  # cache warm


def test_two_profiles_two_venvs_and_a_bad_pin_keeps_the_active_one(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", trainer_args="--steps 1 --interval 0.01",
                      throughput=False)
    for prof in ("fast", "slow"):
        assert cli(["submit", str(spec), "--profile", prof, "--follow"], env, timeout=120).returncode == 0
    envs = sorted(p.name for p in (tmp_path / "root" / "envs").iterdir())
    assert [e.split("-")[0] for e in envs] == ["fast", "slow"]
    listing = cli_json(["profiles", "box", "--json"], env)
    assert {e["profile"] for e in listing["envs"] if e["installed"]} == {"fast", "slow"}
    # a pin that does not exist: a clear failure, and the installed profiles still work
    bad = write_spec(tmp_path / "bad.yaml", target="box", fast_url=index_urls["fast"],
                     slow_url=index_urls["slow"], profile="fast", throughput=False,
                     trainer_args="--steps 1 --interval 0.01",
                     profiles=[{"name": "fast", "index_url": index_urls["fast"],
                                "packages": ["gpujob-demo-kernels==9.9.9+nope"]}])
    p = cli(["submit", str(bad), "--follow"], env, timeout=120)
    assert p.returncode == 1
    st = status(job_id_of(p.stdout), env)
    assert st["state"] == "failed"
    assert "installing profile fast failed" in st["reason"] and "9.9.9" in st["reason"]
    assert sorted(p.name for p in (tmp_path / "root" / "envs").iterdir()) == envs
    again = cli(["submit", str(spec), "--profile", "slow", "--follow"], env, timeout=120)
    assert again.returncode == 0, again.stdout.decode()[-2000:]


def test_plan_runs_nothing(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"])
    p = cli(["submit", str(spec), "--plan"], env)
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    for word in ("probe", "submit", "uv venv", "uv pip install", "CUDA_VISIBLE_DEVICES=3",
                 "python trainer.py"):
        assert word in out
    # the interpreter the supervisor builds the venv on (the agent's: the one `gpujob` runs on, named
    # by its entry script's #! line, python or python3 of this venv), not a bare python3
    built_on = re.search(r"uv venv --python (\S+) ", out.replace("\n", " ")).group(1)
    assert os.path.realpath(built_on) == os.path.realpath(sys.executable), built_on
    assert not (tmp_path / "root").exists()  # nothing was created on the target side
    assert not (tmp_path / "state").exists()  # and no job recorded


def test_busy_container_refused_and_stop_leaves_nothing(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", throughput=False,
                      trainer_args="--steps 1000 --interval 0.1")
    job_id = submit(spec, env)
    wait_for(lambda: status(job_id, env)["state"] == "training", 60, what="training")
    second = cli(["submit", str(spec)], env)
    assert second.returncode == 5
    assert (f"container busy: job {job_id} of " in second.stderr.decode()
            and " holds it (supervisor pid" in second.stderr.decode())
    pgid = json.loads((journal(tmp_path, job_id) / "state.json").read_text())["child_pgid"]
    p = cli(["stop", job_id], env, check=True)
    assert "stopped" in p.stdout.decode()
    assert status(job_id, env)["state"] == "stopped"
    ps = subprocess.run(["ps", "-eo", "pgid,pid,args"], capture_output=True, text=True).stdout
    assert not [ln for ln in ps.splitlines()[1:] if ln.split()[0] == str(pgid)]
    # the lock is free again
    job2 = submit(spec, env)
    cli(["stop", job2], env, check=True)


def test_controller_killed_job_runs_on(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", throughput=False,
                      trainer_args="--steps 30 --interval 0.05")
    proc = subprocess.Popen([*gpujob_argv(), "submit", str(spec), "--follow"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: list((tmp_path / "root" / "jobs").glob("*/train.log")) and
             "step 3 " in next((tmp_path / "root" / "jobs").glob("*/train.log")).read_text(),
             60, what="training output")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    job_id = next((tmp_path / "root" / "jobs").iterdir()).name
    wait_for(lambda: status(job_id, env)["state"] == "succeeded", 60, what="the job to finish")
    logs = cli(["logs", job_id], env, check=True).stdout.decode()
    assert [ln.split()[1] for ln in logs.splitlines() if ln.startswith("step ")] == \
        [str(i) for i in range(1, 31)]


# ---- rollback (issue 4) -----------------------------------------------------

def test_logs_tail_events_and_ps(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", trainer_args="--steps 12 --interval 0.01")
    job_id = job_id_of(cli(["submit", str(spec), "--follow"], env, check=True).stdout)
    tail = cli(["logs", job_id, "--phase", "train", "--tail", "2"], env, check=True).stdout.decode()
    assert tail.splitlines() == ["step 12 | " + tail.splitlines()[0].split("| ", 1)[1],
                                 "training finished at step 12"]
    ev = cli(["logs", "--events"], env, check=True).stdout.decode()  # default: the latest job
    assert "sample" in ev and "tok/s" in ev and "state" in ev
    rows = cli_json(["ps", "--json"], env)
    assert rows[0]["job"] == job_id and rows[0]["state"] == "succeeded"
    prof = cli(["profiles", "box"], env, check=True).stdout.decode()
    assert "profiles on lab/box" in prof and "fast-" in prof and "untried" in prof and "None" not in prof
    human = cli(["cache", "ls", "box"], env, check=True).stdout.decode()
    assert "compile caches on lab/box" in human and "fast-" in human and "None" not in human
    ls = cli_json(["cache", "ls", "box", "--json"], env)
    assert ls["caches"] and ls["caches"][0]["parts"]["inductor"] > 0
    cleared = cli(["cache", "clear", "box", "--profile", "fast"], env, check=True).stdout.decode()
    assert "fast-" in cleared
    assert cli_json(["cache", "ls", "box", "--json"], env)["caches"] == []


def trainers_of(tmp_path) -> list:
    """Pids of this test's demo trainers (never more than one may run)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        argv = cmd.split(b"\0")
        if len(argv) > 1 and argv[1] == b"trainer.py" and b"python" in argv[0] \
                and cwd.startswith(str(tmp_path)) and not zombie:
            found.append(int(pid))
    return found


def test_a_dead_supervisor_is_restarted_and_readopts_the_running_trainer(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", warmup=False,
                      trainer_args="--steps 100000 --interval 0.1")
    job_id = submit(spec, env)
    wait_for(lambda: status(job_id, env)["state"] == "training", 60, what="training")
    j = journal(tmp_path, job_id)
    wait_for(lambda: trainers_of(tmp_path), 30, what="the trainer")
    st = json.loads((j / "state.json").read_text())
    trainer = trainers_of(tmp_path)
    assert len(trainer) == 1
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    # a resubmit onto the container never starts a second trainer
    p = cli(["submit", str(spec)], env)
    assert p.returncode == 5 and "still runs" in p.stderr.decode(), p.stderr.decode()
    assert trainers_of(tmp_path) == trainer
    # status notices the dead supervisor, starts a new one, which re-adopts the same trainer
    p = cli(["status", job_id], env, check=True)
    assert "restarted its supervisor" in p.stderr.decode()
    t0 = time.monotonic()
    wait_for(lambda: any(e["type"] == "readopted" for e in events(j)), 20, what="re-adoption")
    readopt_s = time.monotonic() - t0
    st2 = json.loads((j / "state.json").read_text())
    assert st2["supervisor_pid"] != st["supervisor_pid"] and st2["child"]["pgid"] == st["child"]["pgid"]
    n = len((j / "samples.jsonl").read_text().splitlines())
    wait_for(lambda: len((j / "samples.jsonl").read_text().splitlines()) > n + 3, 20,
             what="samples after re-adoption")
    assert trainers_of(tmp_path) == trainer
    assert status(job_id, env)["state"] == "training"
    # job.log holds every step once, across the supervisor's death
    cli(["stop", job_id], env, check=True)
    steps = [int(ln.split()[1]) for ln in (j / "job.log").read_text().splitlines() if ln.startswith("step ")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 10
    assert not trainers_of(tmp_path) and status(job_id, env)["state"] == "stopped"
    print(f"re-adoption: {readopt_s:.2f}s from `gpujob status` to watching again")


def test_a_job_with_nothing_left_running_is_taken_over_and_can_be_finished(tmp_path, env, index_urls):
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", throughput=False, warmup=False,
                      trainer_args="--steps 100000 --interval 0.1")
    job_id = submit(spec, env)
    wait_for(lambda: status(job_id, env)["state"] == "training", 60, what="training")
    wait_for(lambda: (json.loads((journal(tmp_path, job_id) / "state.json").read_text()).get("child") or {})
             .get("phase") == "train", 30, what="the trainer")
    st = json.loads((journal(tmp_path, job_id) / "state.json").read_text())
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    os.killpg(st["child"]["pgid"], signal.SIGKILL)
    wait_for(lambda: not trainers_of(tmp_path), 10, what="the trainer to die")
    # a new submit notices the dead holder, says so, and takes the lock
    p = cli(["submit", str(spec)], env, check=True)
    assert f"took over the container from job {job_id}" in p.stderr.decode()
    job2 = job_id_of(p.stdout)
    old = status(job_id, env)
    assert old["state"] == "lost" and "taken over by job " + job2 in old["reason"]
    cli(["stop", job2], env, check=True)
    # stopping the lost job marks it stopped
    out = cli(["stop", job_id], env, check=True).stdout.decode()
    assert "stopped" in out and status(job_id, env)["state"] == "stopped"


def test_stop_during_a_slow_install_ends_it_and_leaves_no_partial_venv(tmp_path, env, index_urls):
    import http.server
    import threading

    asked, answer = threading.Event(), threading.Event()

    class Hang(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the install waits on the index until the test ends (HANG x 10 at most)
            asked.set()
            answer.wait(10 * HANG)

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=url, slow_url=url,
                          profile="fast", throughput=False, warmup=False)
        job_id = submit(spec, env)
        wait_for(lambda: any(e["type"] == "env_build" for e in events(journal(tmp_path, job_id))),
                 30, what="the install to start")
        assert asked.wait(HANG)  # the install is waiting on the index
        # it ends the install, the index still not answering: waiting for the install, it would be hung
        cli(["stop", job_id], env, check=True, timeout=2 * HANG)
        st = status(job_id, env)
        assert st["state"] == "stopped"
        assert not list((tmp_path / "root" / "envs").iterdir())
    finally:
        answer.set()
        server.shutdown()


def test_single_file_sync_and_shared_caches(tmp_path, env, index_urls):
    tool = tmp_path / "tool.py"
    tool.write_text("print('tool ran')\n")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], profile="fast", throughput=False,
                      trainer_args="--steps 1 --interval 0.01",
                      caches={"per_profile": False})
    import yaml
    data = yaml.safe_load(spec.read_text())
    data["sync"].append({"src": str(tool), "dest": "bin/renamed.py"})
    spec.write_text(yaml.safe_dump(data))
    assert cli(["submit", str(spec), "--follow"], env, timeout=120).returncode == 0
    work = tmp_path / "root" / "work" / "tjob"
    assert (work / "bin" / "renamed.py").read_text() == "print('tool ran')\n"
    assert not (work / "bin" / "tool.py").exists()
    assert [c.name for c in (tmp_path / "root" / "caches").iterdir()] == ["shared"]
