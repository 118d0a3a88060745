"""train.standby on the `local` target: while a job trains on a profile that may be
rolled back, an interpreter of the known-good profile waits with its heavy imports
done; the rollback runs the trainer in it. (The time it saves is measured on the
H200 by bench.gpu: BENCHMARKS.md.)"""

from __future__ import annotations

import os
import signal
import textwrap

import pytest

from gpujob.agent.base.placeholders import command_script, script_argv
from helpers import cli, events, job_id_of, local_env, wait_for, write_spec
from test_faults import jdir, state_of, wheelhouse  # noqa: F401  (fixture)
from test_jobs_local import trainers_of

TRAINER = textwrap.dedent('''
    import os, sys, time
    preloaded = "heavymod" in sys.modules
    import heavymod
    print(f"preloaded={preloaded} imports={heavymod.IMPORTS}", flush=True)
    resume = "--resume" in sys.argv
    step = int(open("ckpt").read()) if resume and os.path.exists("ckpt") else 0
    rate = 12.8 if os.environ.get("FAST") else 4.0
    for _ in range(int(sys.argv[1])):
        time.sleep(0.05)
        step += 1
        print(f"step {step} | {rate}K tok/s", flush=True)
        open("ckpt.tmp", "w").write(str(step))  # whole or not at all: a SIGTERM may land mid-save
        os.replace("ckpt.tmp", "ckpt")
''')


def test_which_commands_a_standby_can_run():
    assert script_argv(["python3", "train.py", "--x"]) == ["train.py", "--x"]
    assert script_argv(["/venv/bin/python3.12", "-m", "pkg.train"]) == ["-m", "pkg.train"]
    assert script_argv(["torchrun", "train.py"]) is None and script_argv(["python", "-c", "x"]) is None
    assert command_script("python t.py --n 3") == ["t.py", "--n", "3"]
    assert command_script("cd x && python t.py") is None and command_script("python t.py $X") is None


@pytest.fixture
def job(tmp_path, wheelhouse):  # noqa: F811
    code = tmp_path / "code"
    code.mkdir()
    (code / "t.py").write_text(TRAINER)
    (code / "heavymod.py").write_text("import time\ntime.sleep(1.0)  # a heavy import, like torch\nIMPORTS = "
                                      "1\n")
    urls = wheelhouse[1]

    def spec(name: str, profile: str, steps: int):
        s = write_spec(tmp_path / name, target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                       profile=profile, warmup=False, sync=[{"src": str(code), "dest": "."}],
                       train={"command": f"python t.py {steps}", "resume_args": ["--resume"], "grace": "2s",
                              "standby": {"preload": ["heavymod"]}})
        text = s.read_text().replace("- name: fast\n", "- name: fast\n  env: {FAST: '1'}\n")
        s.write_text(text)
        return s
    return spec


def test_a_rollback_runs_the_known_good_trainer_in_its_preloaded_standby(tmp_path, job):
    env = local_env(tmp_path)
    first = job_id_of(cli(["submit", str(job("a.yaml", "fast", 40)), "--follow"], env, check=True).stdout)
    assert state_of(tmp_path, first)["state"] == "succeeded"
    assert not any(e["type"] == "standby_started" for e in events(jdir(tmp_path, first)))  # nowhere to go
    second = job_id_of(cli(["submit", str(job("b.yaml", "slow", 200)), "--follow"], env, check=True).stdout)
    st = state_of(tmp_path, second)
    assert st["state"] == "succeeded" and st["profile"] == "fast", st.get("reason")
    ev = events(jdir(tmp_path, second))
    kinds = [e["type"] for e in ev]
    assert kinds.index("standby_started") < kinds.index("rollback") < kinds.index("standby_used")
    log = (jdir(tmp_path, second) / "train.log").read_text()
    assert "preloaded=False" in log and "preloaded=True" in log  # slow started cold, fast in the standby
    assert "started in its standby interpreter" in (jdir(tmp_path, second) / "job.log").read_text()
    assert st.get("standby") is None and not trainers_of(tmp_path)


def test_a_standby_left_by_a_dead_supervisor_is_ended_by_the_next(tmp_path, job):
    env = local_env(tmp_path)
    cli(["submit", str(job("a.yaml", "fast", 40)), "--follow"], env, check=True)
    spec = job("b.yaml", "slow", 100000)
    txt = spec.read_text().replace("window: 3", "window: 3\n  initial_delay: 1h")  # never rolls back
    spec.write_text(txt)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    wait_for(lambda: (state_of(tmp_path, job_id).get("standby") or {}).get("pgid"), 30, what="a standby")
    sb = state_of(tmp_path, job_id)["standby"]
    os.kill(state_of(tmp_path, job_id)["supervisor_pid"], signal.SIGKILL)
    cli(["status", job_id], env, check=True)  # restarts the supervisor
    wait_for(lambda: any(e["type"] == "standby_dropped" for e in events(jdir(tmp_path, job_id))), 20,
             what="the old standby to be ended")
    wait_for(lambda: not _alive(sb["pgid"]), 10, what="the old standby's group to go")
    cli(["stop", job_id], env, check=True)
    assert not trainers_of(tmp_path)


def _alive(pgid: int) -> bool:
    from gpujob.agent.base.proc import group_pids
    return bool(group_pids(pgid))


def test_standby_needs_a_plain_python_command(tmp_path):
    spec = tmp_path / "j.yaml"
    spec.write_text("name: x\nprofiles: [{name: a, index_url: 'https://x', packages: ['torch==2.0']}]\n"
                    "train:\n  command: torchrun --nproc_per_node 8 train.py\n  standby: {preload: "
                    "[torch]}\n")
    p = cli(["submit", str(spec), "--target", "box", "--plan"], local_env(tmp_path))
    assert p.returncode == 2
    assert p.stderr.decode().startswith(f"gpujob: {spec}:5: train.standby: needs train.command to be")
