"""The benchmark's stand-in trainer (runs in the container, in the profile's venv).

Like jobs/demo/trainer.py its speed comes from the ``gpujob-demo-kernels`` build
of its venv, but every line starts with the wall-clock time it was printed at
(``1732890000.123456 ...``) so the controller side can measure write→print
latency, and it can print at a fixed rate (``--rate`` lines/s), flushing each
line the way ``print(..., flush=True)`` trainers do.

    --rate 1000 --seconds 60 --tps-every 10   1000 lines/s for 60 s; every 10th
                                              line is a step line with tok/s
    --lines 30 --rate 20                      30 step lines, 20 a second
    --eval-every 5                            an eval line every 5 s (a pause_pattern's)
"""

import argparse
import json
import os
import random
import sys
import time

import demo_kernels

p = argparse.ArgumentParser()
p.add_argument("--rate", type=float, default=20.0, help="lines per second")
p.add_argument("--seconds", type=float, default=None, help="run this long (else --lines)")
p.add_argument("--lines", type=int, default=30)
p.add_argument("--tps-every", type=int, default=1, help="every Nth line carries tok/s")
p.add_argument("--resume", action="store_true")
p.add_argument("--checkpoint", default="checkpoint.json")
p.add_argument("--eval-every", type=float, default=None, help="an 'eval:' line every this many seconds")
args = p.parse_args()

out = sys.stdout
seq = 0
if args.resume and os.path.exists(args.checkpoint):
    with open(args.checkpoint) as f:
        seq = json.load(f)["seq"]
    out.write(f"{time.time():.6f} resumed from checkpoint at line {seq}\n")
out.write(f"{time.time():.6f} bench trainer: kernels build {demo_kernels.BUILD}, "
          f"{args.rate:g} lines/s\n")
out.flush()
rng = random.Random(seq)
start = time.time()
first = seq
total = None if args.seconds is not None else args.lines
speed = demo_kernels.TOKENS_PER_SECOND
ckpt_every = max(1, int(args.rate / 4))  # a few checkpoints a second at most
next_eval = start + (args.eval_every or 0)


def checkpoint():
    with open(args.checkpoint + ".tmp", "w") as f:
        json.dump({"seq": seq}, f)
    os.replace(args.checkpoint + ".tmp", args.checkpoint)


while True:
    if total is not None and seq >= total:
        break
    if args.seconds is not None and time.time() - start >= args.seconds:
        break
    due = start + (seq - first + 1) / args.rate
    wait = due - time.time()
    if wait > 0:
        time.sleep(wait)
    seq += 1
    if seq % args.tps_every == 0:
        tps = speed * rng.uniform(0.97, 1.03)
        out.write(f"{time.time():.6f} step {seq} | loss {8.0 / (1 + seq * 0.05):.4f} | "
                  f"{tps / 1000:.1f}K tok/s\n")
    else:
        out.write(f"{time.time():.6f} seq {seq} | data loader: batch ready, padding 3.1%\n")
    if args.eval_every and time.time() >= next_eval:
        out.write(f"{time.time():.6f} eval: val loss {8.0 / (1 + seq * 0.05):.4f}\n")
        next_eval += args.eval_every
    out.flush()
    if seq % ckpt_every == 0:
        checkpoint()
checkpoint()
out.write(f"{time.time():.6f} training finished at line {seq}\n")
out.flush()
