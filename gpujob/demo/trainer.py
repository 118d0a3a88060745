"""A stand-in trainer for the gpujob demo and tests.

It trains nothing: it prints step lines like a real trainer
(``step 12 | loss 3.2101 | 12.8K tok/s``), and its speed comes from whichever
build of ``gpujob-demo-kernels`` its venv holds, the way a torch wheel build
decides the speed of compiled kernels. It checkpoints the step it reached, and
``--resume`` continues from there: one file rewritten in place (``--checkpoint``,
nanoGPT's ``out/ckpt.pt``), or with ``--checkpoint-dir`` one directory per save
(``checkpoint-N/``, HF Trainer's layout) whose ``model.json`` comes first and whose
``trainer_state.json`` lands ``--save-seconds`` later; ``--resume`` then takes the
highest-numbered directory and fails on an unfinished one, as HF does.
``--resume-from PATH`` loads that checkpoint (a file or a directory).
"""

import argparse
import json
import os
import random
import sys
import time

import demo_kernels

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--interval", type=float, default=0.25, help="seconds per step")
p.add_argument("--resume", action="store_true")
p.add_argument("--checkpoint", default="checkpoint.json")
p.add_argument("--checkpoint-every", type=int, default=1, help="steps between checkpoints")
p.add_argument("--checkpoint-dir", default=None, help="one checkpoint-N/ directory per save instead")
p.add_argument("--save-seconds", type=float, default=0.0, help="--checkpoint-dir: a save takes this long")
p.add_argument("--resume-from", default=None, help="load this checkpoint (file or directory)")
p.add_argument("--fail-on-build", default=None, help="crash at --fail-step on this build")
p.add_argument("--fail-step", type=int, default=5)
p.add_argument("--fail-message", default="RuntimeError: kernel launch failed")
p.add_argument("--hang-on-fail", action="store_true", help="print the failure, then hang instead of exiting")
args = p.parse_args()



def load(path):
    """The step a checkpoint holds (file, or checkpoint-N/ directory); exit 1 on a torn one."""
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "trainer_state.json")):
            print(f"ValueError: Can't find a valid checkpoint at {path}", file=sys.stderr, flush=True)
            sys.exit(1)
        path = os.path.join(path, "trainer_state.json")
    with open(path) as f:
        return json.load(f)["step"]


def newest_dir(top):
    found = [d for d in os.listdir(top) if d.startswith("checkpoint-")] if os.path.isdir(top) else []
    return os.path.join(top, max(found, key=lambda d: int(d.split("-")[1]))) if found else None


def save(step):
    if args.checkpoint_dir is None:
        with open(args.checkpoint + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(args.checkpoint + ".tmp", args.checkpoint)
        return
    d = os.path.join(args.checkpoint_dir, f"checkpoint-{step}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.json"), "w") as f:
        json.dump({"step": step, "weights": "x" * 1000}, f)
    time.sleep(args.save_seconds)
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"step": step}, f)


step = 0
source = args.resume_from
if source is None and args.resume:
    source = newest_dir(args.checkpoint_dir) if args.checkpoint_dir else \
        (args.checkpoint if os.path.exists(args.checkpoint) else None)
if source:
    step = load(source)
    print(f"resumed from checkpoint at step {step} ({source})")
print(f"demo trainer: kernels build {demo_kernels.BUILD} ({demo_kernels.__version__}), "
      f"GPUs drafter={os.environ.get('GPUJOB_GPUS_DRAFTER', '-')}", flush=True)
rng = random.Random(step)
while step < args.steps:
    time.sleep(args.interval)
    step += 1
    if args.fail_on_build == demo_kernels.BUILD and step >= args.fail_step:
        print(f"Traceback (most recent call last):\n  ...\n{args.fail_message}", file=sys.stderr, flush=True)
        if args.hang_on_fail:
            time.sleep(3600)
        sys.exit(1)
    tps = demo_kernels.TOKENS_PER_SECOND * rng.uniform(0.97, 1.03)
    loss = 8.0 / (1 + step * 0.05)
    print(f"step {step} | loss {loss:.4f} | {tps / 1000:.1f}K tok/s", flush=True)
    if step % args.checkpoint_every:
        continue
    save(step)
print(f"training finished at step {step}")
