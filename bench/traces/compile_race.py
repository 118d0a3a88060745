"""The seeds' compile race (issue 23 item 5): N threads each compile flex_attention
(``torch.compile(flex_attention)``) with their own ``create_block_mask`` and run
forward + backward, all released at once by a barrier, as jobs/dflash_mini's
drafter threads would. Point TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR) at an
empty folder for a cold cache, or at one a ``--threads 1`` run filled for a warm one.

``--serial-first``: each thread's first call (where dynamo traces and inductor
compiles) runs under one lock, one thread after another, then all threads run the
remaining steps at once (a second barrier): the trainer-side way out that
jobs/dflash_mini takes (its first step runs the drafters one after another).

Prints one line per thread (``thread i: ok in X s`` or ``thread i: FAILED: ...``
with its traceback) and ``race: threads=N ok=K failed=M``; exit 0 when all
succeeded, 1 otherwise. A hang prints nothing more: the recorder's SIGABRT then
makes faulthandler (PYTHONFAULTHANDLER=1) dump every thread's stack.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def dflash_mask(block):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (q_idx // block == kv_idx // block)
    return mask_mod


FIRST = threading.Lock()


def work(i, a, barrier, results, after_first):
    try:
        barrier.wait()
        t = time.time()
        dev = a.device
        if dev == "cuda":
            torch.cuda.set_device(0)
        fn = torch.compile(flex_attention, dynamic=False)
        mask = create_block_mask(dflash_mask(a.block), None, None, a.seq, a.seq, device=dev)
        shape = (a.batch, a.heads, a.seq, a.dim)
        dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=dev == "cuda") for _ in range(3))
        def step():
            out = fn(q, k, v, block_mask=mask)
            if dev == "cuda":
                out.float().sum().backward()
        if a.serial_first:
            with FIRST:
                step()
                if dev == "cuda":
                    torch.cuda.synchronize()
            after_first.wait()  # then the rest, every thread at once
        for _ in range(a.steps - (1 if a.serial_first else 0)):
            step()
        if dev == "cuda":
            torch.cuda.synchronize()
        results[i] = ("ok", time.time() - t)
        print(f"thread {i}: ok in {time.time() - t:.2f}s", flush=True)
    except Exception as e:  # the race's symptom: report it, per thread
        results[i] = ("failed", repr(e))
        print(f"thread {i}: FAILED: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
        sys.stderr.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--serial-first", action="store_true", help="first call per thread under one lock")
    a = p.parse_args()
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(default)")
    n_files = sum(len(f) for _d, _s, f in os.walk(cache)) if os.path.isdir(cache) else 0
    print(f"compile_race: torch {torch.__version__}, threads {a.threads}, inductor cache {cache} "
          f"({n_files} files at start), serial first {a.serial_first}", flush=True)
    if a.device == "cuda":
        torch.zeros(1, device="cuda")  # CUDA context before the threads
    barrier, after_first = threading.Barrier(a.threads), threading.Barrier(a.threads)
    results = [None] * a.threads
    threads = [threading.Thread(target=work, args=(i, a, barrier, results, after_first), name=f"drafter_{i}")
               for i in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = sum(1 for r in results if r and r[0] == "ok")
    print(f"race: threads={a.threads} ok={ok} failed={a.threads - ok}", flush=True)
    return 0 if ok == a.threads else 1


if __name__ == "__main__":
    sys.exit(main())
