"""A nanoGPT-shaped trainer for the first-day journey (tests/test_journey_first_day.py): its
own flags through configurator.py (a config file, then --key=value), `iter N: loss X, time
Y ms` lines, an eval line and out/ckpt.pt rewritten in place at each eval_interval, and
--init_from=resume. It trains nothing: its speed is the kernels' wheel build in its venv
(gpujob-demo-kernels: fast or slow), as a torch build decides a real trainer's."""

import os
import sys
import time

import demo_kernels
from model import GPT

out_dir = "out"
eval_interval = 20
log_interval = 10
max_iters = 60
init_from = "scratch"
always_save_checkpoint = True
batch_size = 4
block_size = 640
gradient_accumulation_steps = 1
exec(open("configurator.py").read())

tokens = batch_size * block_size * gradient_accumulation_steps
model = GPT()
first = 0
if init_from == "resume":
    with open(os.path.join(out_dir, "ckpt.pt")) as f:
        first = int(f.read())
    print(f"resuming training from {out_dir} at iter {first}", flush=True)
print(f"tokens per iteration will be: {tokens:,}", flush=True)
for it in range(first + 1, max_iters + 1):
    dt = tokens / demo_kernels.TOKENS_PER_SECOND
    time.sleep(dt)
    if it % eval_interval == 0:
        print(f"step {it}: train loss {model.loss(it):.4f}, val loss {model.loss(it) + 0.1:.4f}", flush=True)
        if always_save_checkpoint:
            print(f"saving checkpoint to {out_dir}", flush=True)
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "ckpt.pt"), "w") as f:  # in place, as torch.save does
                f.write(str(it))
    if it % log_interval == 0:
        print(f"iter {it}: loss {model.loss(it):.4f}, time {dt * 1000:.2f}ms, mfu 1.00%", flush=True)
sys.exit(0)
