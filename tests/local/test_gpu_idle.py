"""gpu_idle with a mocked nvidia-smi (a script on PATH reading the utilisation the
stand-in trainer writes): the start-up window and checkpoint saves are not idleness;
a real stall of the GPUs is."""

from __future__ import annotations

import os
import textwrap

import yaml

from gpujob.agent.judge import checkpoint
from helpers import cli, cli_json, job_id_of, local_env

TRAINER = textwrap.dedent('''
    import argparse, os, time
    p = argparse.ArgumentParser()
    p.add_argument("--util-file"); p.add_argument("--save", type=float)
    p.add_argument("--first-save", type=float)
    p.add_argument("--write-checkpoints", type=int, default=1)
    a = p.parse_args()
    def util(v):
        open(a.util_file + ".t", "w").write(str(v)); os.replace(a.util_file + ".t", a.util_file)
    util(0)
    time.sleep(4.0)                                  # start-up: imports, compile; GPU at 0%
    for step in range(1, 26):
        util(90)
        time.sleep(0.1)
        print(f"step {step} | 12.8K tok/s", flush=True)
        if step % 10 == 0:                           # a checkpoint save: GPU at 0%
            util(0)
            time.sleep(a.first_save if step == 10 else a.save)
            if a.write_checkpoints:
                open(f"ckpt_step_{step}.pt", "w").write("x")
    print("done", flush=True)
''')


def run(tmp_path, index_urls, write_checkpoints: int):
    fake = tmp_path / "bin"
    fake.mkdir()
    util = tmp_path / "util"
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '0, %s\\n' \"$(cat {util} 2>/dev/null || echo "
                                     f"0)\"\n")
    (fake / "nvidia-smi").chmod(0o755)
    code = tmp_path / "code"
    code.mkdir()
    (code / "trainer.py").write_text(TRAINER)
    env = local_env(tmp_path)
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    spec = {"name": "idle", "target": "box", "sync": [{"src": str(code), "dest": "."}],
            "gpus": {"drafter": [0]},
            "profiles": [{"name": "fast", "index_url": index_urls["fast"],
                          "packages": ["gpujob-demo-kernels==1.0.0+fast"]}],
            "train": {"command": f"python trainer.py --util-file {util} --first-save 3.0 --save 4.2 "
                                 f"--write-checkpoints {write_checkpoints}",
                      "checkpoint": {"path": "ckpt_step_*.pt", "every": "5s"}},
            "throughput": {"format": "ktok", "min": "1K", "window": 3, "good_after": "1h"},
            "rollback": {"on": ["gpu_idle"], "gpu_idle": {"group": "drafter", "below": 5, "for": "3s"}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    p = cli(["submit", str(path), "--follow"], env, timeout=180)
    return p, cli_json(["status", job_id_of(p.stdout), "--json"], env)


def test_start_up_and_checkpoint_saves_are_not_idle(tmp_path, index_urls):
    # 4 s of start-up at 0% and saves of 3.0 s then 4.2 s, with gpu_idle.for = 3 s (polled every 0.6 s)
    p, st = run(tmp_path, index_urls, write_checkpoints=1)
    assert p.returncode == 0 and st["state"] == "succeeded", p.stdout.decode()[-2000:]


def test_the_same_gaps_without_checkpoints_are_idle(tmp_path, index_urls):
    p, st = run(tmp_path, index_urls, write_checkpoints=0)
    assert st["state"] == "failed" and st["signal"] == "gpu_idle", p.stdout.decode()[-2000:]


def test_idle_gap_learns_the_save_time():
    hist = [(0, 90), (1, 0), (2, 0), (3, 0)]
    assert checkpoint.idle_gap(hist, 5, 0.0, 0.0) == (2, 0.0)
    assert checkpoint.idle_gap(hist, 5, 2.5, 0.0) == (0.5, 1.5)  # saved at 2.5: 1.5 s was the save
    ended = hist + [(4, 90)]
    assert checkpoint.idle_gap(ended, 5, 3.5, 0.0) == (0.0, 2.5)  # learnt after the stretch ended
    assert checkpoint.idle_gap(ended, 5, 0.0, 1.0) == (0.0, 1.0)
