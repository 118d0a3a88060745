"""Faults of the trainer itself (its last line, a hang after an error signature, crash loops, a
kill from outside, a chatty log) through the local kind; the supervisor's own deaths and
install faults are in test_faults.py, whose fixtures these share."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from helpers import cli, job_id_of, wait_for, write_spec
from test_faults import env, jdir, state_of, submit, submit_training, wheelhouse  # noqa: F401 (fixtures and helpers)
from test_jobs_local import trainers_of


def _trainer_dir(tmp_path: Path, name: str, code: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "t.py").write_text(code)
    return d


def test_a_last_line_without_newline_is_read_and_gpujob_s_line_starts_a_new_one(tmp_path, env, wheelhouse):
    d = _trainer_dir(tmp_path, "oom", "import sys\nprint('step 1 | 12.8K tok/s', flush=True)\n"
                     "sys.stdout.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 "
                     "GiB')\n"
                     "sys.exit(1)\n")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=wheelhouse[1]["fast"],
                      slow_url=wheelhouse[1]["slow"], profile="fast", warmup=False,
                      sync=[{"src": str(d), "dest": "."}], train={"command": "python t.py"})
    job_id = submit(spec, env)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") == "failed", 30, what="the failure")
    st = state_of(tmp_path, job_id)
    assert st["signal"] == "cuda_oom", st
    log = (jdir(tmp_path, job_id) / "job.log").read_text().splitlines()
    oom = next(i for i, ln in enumerate(log) if ln.startswith("torch.OutOfMemoryError"))
    assert log[oom].endswith("2 GiB") and log[oom + 1].startswith("[gpujob ")


def test_stop_on_stops_a_trainer_that_hangs_after_an_error_signature(tmp_path, env, wheelhouse):
    d = _trainer_dir(tmp_path, "hang", "import time\nprint('step 1 | 12.8K tok/s', flush=True)\n"
                     "print('torch._dynamo: is_fx_symbolic_tracing', flush=True)\ntime.sleep(600)\n")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=wheelhouse[1]["fast"],
                      slow_url=wheelhouse[1]["slow"], profile="fast", warmup=False, throughput=False,
                      sync=[{"src": str(d), "dest": "."}], train={"command": "python t.py", "grace": "1s"},
                      rollback={"on": ["low_throughput"], "stop_on": ["error_signature"],
                                "signature_grace": "1s"})
    job_id = submit(spec, env)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") == "failed", 30, what="the stop")
    st = state_of(tmp_path, job_id)
    assert "error_signature is in rollback.stop_on" in st["reason"] and "kept running 1s" in st["reason"]
    assert not trainers_of(tmp_path)


def test_restarts_on_the_same_profile_then_a_crash_loop_ends_the_job(tmp_path, env, wheelhouse):
    d = _trainer_dir(tmp_path, "flaky", (
        "import os, sys, time\n"
        "resume = '--resume' in sys.argv\n"
        "start = int(open('ckpt').read()) if resume and os.path.exists('ckpt') else 0\n"
        "print('resumed at', start, flush=True) if resume else None\n"
        "for step in range(start + 1, 9):\n"
        "    time.sleep(0.02)\n"
        "    print(f'step {step} | 12.8K tok/s', flush=True)\n"
        "    open('ckpt', 'w').write(str(step))\n"
        "    if (step == 4 and not resume) or (os.environ.get('ALWAYS_CRASH') and step == start + 2):\n"
        "        print('RuntimeError: NCCL watchdog timeout', flush=True); sys.exit(1)\n"))
    base = dict(target="box", fast_url=wheelhouse[1]["fast"], slow_url=wheelhouse[1]["slow"], profile="fast",
                warmup=False, throughput=False, sync=[{"src": str(d), "dest": "."}])
    spec = write_spec(tmp_path / "job.yaml", **base,
                      train={"command": "python t.py", "resume_args": ["--resume"],
                             "restarts": {"max": 2, "within": "1h"}})
    job_id = submit(spec, env)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") in ("succeeded", "failed"), 60, what="the end")
    st = state_of(tmp_path, job_id)
    assert (st["state"] == "succeeded" and len(st["restarts"]) == 1
            and st["restarts"][0]["signal"] == "nccl_timeout")
    assert not st.get("rollbacks")  # restarts are counted apart from rollbacks
    steps = [ln for ln in (jdir(tmp_path, job_id) / "train.log").read_text().splitlines()
             if ln.startswith("step")]
    assert (steps[-1].startswith("step 8")
            and "resumed at 4" in (jdir(tmp_path, job_id) / "job.log").read_text())
    # a trainer that crashes every time: two restarts, then the loop ends the job
    (tmp_path / "root" / "work" / "tjob" / "ckpt").unlink()
    spec = write_spec(tmp_path / "job2.yaml", **base, env={"ALWAYS_CRASH": "1"},
                      train={"command": "python t.py", "resume_args": ["--resume"],
                             "restarts": {"max": 2, "within": "1h"}})
    job_id = submit(spec, env)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") in ("succeeded", "failed"), 60, what="the end")
    st = state_of(tmp_path, job_id)
    assert st["state"] == "failed" and "crash loop: 2 restarts" in st["reason"] and len(st["restarts"]) == 2


def test_a_killed_trainer_is_classified_and_the_job_can_be_restarted_by_hand(tmp_path, env, wheelhouse):
    job_id = submit_training(tmp_path, env, wheelhouse)
    os.killpg(state_of(tmp_path, job_id)["child"]["pgid"], signal.SIGKILL)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") == "failed", 30, what="the failure")
    st = state_of(tmp_path, job_id)
    assert st["signal"] == "oom_killed" and "SIGKILL" in st["reason"]
    # the user finishes it: a rollback by hand onto the other profile resumes it
    cli(["rollback", job_id, "--to", "slow"], env, check=True)
    wait_for(lambda: state_of(tmp_path, job_id).get("state") == "training", 60, what="training on slow")
    wait_for(lambda: trainers_of(tmp_path), 10, what="the trainer")
    time.sleep(0.3)
    assert len(trainers_of(tmp_path)) == 1
    cli(["stop", job_id], env, check=True)
    assert state_of(tmp_path, job_id)["state"] == "stopped"


def test_a_chatty_trainer_s_logs_stay_within_journal_keep_log(tmp_path, env, wheelhouse):
    code = tmp_path / "chatty"
    code.mkdir()
    (code / "t.py").write_text("line = 'z' * 1000\nfor i in range(6000):\n    print(f'step {i} | {line}')\n"
                               "print('last line', flush=True)\n")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=wheelhouse[1]["fast"],
                      slow_url=wheelhouse[1]["slow"], profile="fast", throughput=False, warmup=False,
                      sync=[{"src": str(code), "dest": "."}], train={"command": "python t.py"},
                      journal={"keep_log": "1M"})
    job_id = job_id_of(cli(["submit", str(spec), "--follow"], env, check=True, timeout=120).stdout)
    d = jdir(tmp_path, job_id)
    for name in ("job.log", "train.log"):
        st = os.stat(d / name)
        assert st.st_size > 5_000_000 and st.st_blocks * 512 < 2_200_000, (name, st.st_size, st.st_blocks)
    begins = json.loads((d / "trimmed.json").read_text())
    assert begins["job.log"] > 0 and begins["train.log"] > 0
    tail = cli(["logs", job_id, "-n", "3"], env, check=True).stdout.decode().splitlines()
    assert tail[0] == "last line" and "cache: snapshot of" in tail[1] and "job succeeded" in tail[2]
    whole = cli(["logs", job_id], env, check=True)
    assert "bytes of job.log before this point were trimmed" in whole.stderr.decode()
    out = whole.stdout.decode()
    assert "\0" not in out and out.endswith("job succeeded: train exited 0\n")
    steps = [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("step ")]
    assert steps == list(range(steps[0], 6000))  # from where it begins: every line once, none cut
