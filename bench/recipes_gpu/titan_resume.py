"""The torchtitan recipe's starts on real torchtitan (issue 38 row 4, item 3): the argv the
supervisor runs for a fresh job, a job started by `submit --resume-from JOB`, a fresh job
beside both, and a rollback of the resumed job, each built from the recipe's command and
resume_args (agent/base/placeholders.command_argv, as phases.py builds it), run in the tiny
job of torchtitan_tiny.py; the trainer's own first step says what it loaded.

    python -m bench.recipes_gpu.titan_resume --python PY [--device cpu|cuda] [--out DIR]

PY: an interpreter with torch and torchtitan 0.2.2 (torchtitan_wheels.txt; on the CPU also
triton, which torchtitan's MoE kernels import). Expected, and seen on the CPU (torch 2.13.0+cpu,
torchtitan 0.2.2, 2026-12-05): job-a 1..20 (saves step-10, step-20); job-b resumed from job-a's
step-20: first step 21; job-c fresh beside them: first step 1; job-b's rollback (its own folder
is there): first step 26, from its own step-25 (torchtitan logs that it sets initial_load_path
aside). With revision 5's empty resume_args job-b started at step 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.recipes_gpu.torchtitan_tiny import build
from gpujob.agent.base.placeholders import command_argv, substitute
from gpujob.spec.recipes.registry import RECIPES

TRAINERS = Path(__file__).resolve().parent / "trainers"
STEP = re.compile(r"step:\s+(\d+)")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def first_step(python: str, code: Path, device: str, job: str, steps: int,
               resume_from: str | None = None) -> int:
    entry = "titan_cpu" if device == "cpu" else "torchtitan.train"
    base = f"python -m torch.distributed.run --nproc_per_node 1 -m {entry} --job.config_file train.toml"
    frag = RECIPES["torchtitan"].derive({"train": {"command": base}})
    extra = ([substitute(a, {"resume_from": resume_from}) for a in frag["train"]["resume_args"]]
             if resume_from else [])
    argv = command_argv(f"{frag['train']['command']} --training.steps {steps}",
                        {"job_id": job, "workdir": str(code)}, extra)
    env = dict(os.environ, PATH=f"{Path(python).parent}:{os.environ['PATH']}", HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1", PYTHONPATH=str(TRAINERS))
    p = subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True, timeout=1800)
    seen = [int(s) for s in STEP.findall(COLOUR.sub("", p.stdout + p.stderr))]
    if p.returncode or not seen:
        sys.exit(f"{job}: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    return seen[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recipes_gpu.titan_resume",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="an interpreter with torch and torchtitan 0.2.2")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", default=None, help="the tiny job's directory (default: a new temporary one)")
    args = p.parse_args(argv)
    code = Path(args.out or tempfile.mkdtemp(prefix="titan-resume-"))
    build(code, args.device)
    run = {"job-a": first_step(args.python, code, args.device, "job-a", 20)}
    a20 = str(code / "outputs" / "checkpoint" / "job-a" / "step-20")
    run["job-b (submit --resume-from job-a)"] = first_step(args.python, code, args.device, "job-b", 25, a20)
    run["job-c (fresh, beside them)"] = first_step(args.python, code, args.device, "job-c", 3)
    run["job-b rollback (own folder)"] = first_step(args.python, code, args.device, "job-b", 30, a20)
    print(json.dumps({"first_step": run, "dir": str(code)}))
    want = [1, 21, 1, 26]
    return 0 if list(run.values()) == want else 1


if __name__ == "__main__":
    sys.exit(main())
