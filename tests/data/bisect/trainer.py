"""A stand-in trainer for `gpujob bisect` and `tune` (tests/test_bisect_bed.py): its speed is
the product of what five packages (bis-a .. bis-e) say, like wheels of torch, triton and a
CUDA runtime deciding a real trainer's speed. A package's ``FACTOR`` slows it alone; two
packages whose ``PAIR`` is set halve it only together."""

import argparse
import importlib
import json
import os
import random
import time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=400)
p.add_argument("--interval", type=float, default=0.05)
p.add_argument("--ckpt", default="ckpt/state.json", help="written every 10 steps")
p.add_argument("--resume", action="store_true", help="start from --ckpt's step")
args = p.parse_args()

rate, pair, seen = 10000.0, 0, []
for name in "abcde":
    mod = importlib.import_module(f"bis_{name}")
    rate *= getattr(mod, "FACTOR", 1.0)
    pair += bool(getattr(mod, "PAIR", False))
    seen.append(f"bis-{name} {mod.__version__}")
if pair >= 2:
    rate *= 0.5
print("bisect stand-in: " + ", ".join(seen), flush=True)
start = 0
if args.resume and os.path.exists(args.ckpt):
    with open(args.ckpt) as f:
        start = json.load(f)["step"]
    print(f"resumed at step {start} from {os.path.abspath(args.ckpt)}", flush=True)
rng = random.Random(1)
for step in range(start + 1, args.steps + 1):
    time.sleep(args.interval)
    print(f"step {step} | loss {8.0 / (1 + step * 0.05):.4f} | {rate * rng.uniform(0.97, 1.03) / 1000:.2f}K "
          f"tok/s", flush=True)
    if step % 10 == 0:
        os.makedirs(os.path.dirname(args.ckpt) or ".", exist_ok=True)
        with open(args.ckpt + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(args.ckpt + ".tmp", args.ckpt)
print(f"training finished at step {args.steps}")
