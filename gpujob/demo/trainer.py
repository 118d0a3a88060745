"""A stand-in trainer for the gpujob demo and tests.

It trains nothing: it prints step lines like a real trainer
(``step 12 | loss 3.2101 | 12.8K tok/s``), and its speed comes from whichever
build of ``gpujob-demo-kernels`` its venv holds, the way a torch wheel build
decides the speed of compiled kernels. It checkpoints the step it reached, and
``--resume`` continues from there.
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
p.add_argument("--fail-on-build", default=None, help="crash at --fail-step on this build")
p.add_argument("--fail-step", type=int, default=5)
p.add_argument("--fail-message", default="RuntimeError: kernel launch failed")
p.add_argument("--hang-on-fail", action="store_true", help="print the failure, then hang instead of exiting")
args = p.parse_args()

step = 0
if args.resume and os.path.exists(args.checkpoint):
    with open(args.checkpoint) as f:
        step = json.load(f)["step"]
    print(f"resumed from checkpoint at step {step}")
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
    with open(args.checkpoint + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(args.checkpoint + ".tmp", args.checkpoint)
print(f"training finished at step {step}")
