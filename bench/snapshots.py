"""The cost of a compile-cache snapshot and a restore (gpujob/agent/home/snapshots.py) for
a 500 MB cache of many small files, hard links vs copies. Not part of the suite.

    python -m bench.snapshots [--mb 500] [--dir /tmp/gpujob-bench-snapshots] [--json out.json]

The cache is shaped like inductor's: 40% inductor, 40% triton, 20% torch_extensions,
files of 4-60 KB (about 16,000 files for 500 MB). Each figure is the median of
``--reps`` runs; the page cache is warm (the cache was just written), which is the
usual case for a snapshot taken by the supervisor right after training proved a
profile. ``sync`` runs before each timing so that writeback of earlier runs does
not land inside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import time

from gpujob.agent.home import snapshots
from gpujob.agent.base import envs


def make_cache(home: str, key: str, mb: int, seed: int = 14) -> dict:
    rnd = random.Random(seed)
    base = envs.cache_dir(home, key)
    budget = {"inductor": mb * 0.4e6, "triton": mb * 0.4e6, "torch_extensions": mb * 0.2e6}
    files = 0
    blob = os.urandom(64 * 1024)
    for sub, size in budget.items():
        written = 0
        i = 0
        while written < size:
            d = os.path.join(base, sub, f"{i % 256:02x}")
            os.makedirs(d, exist_ok=True)
            n = rnd.randint(4, 60) * 1024
            with open(os.path.join(d, f"k{i}.bin"), "wb") as f:
                f.write(blob[:n])
            written += n
            i += 1
            files += 1
    envs.mark_warm(home, key, "bench", profile="bench")
    return {"files": files, "bytes": snapshots.tree_stats(base)["bytes"]}


def timed(fn) -> float:
    subprocess.run(["sync"], check=False)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.snapshots")
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/gpujob-bench-snapshots")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    home, key = os.path.join(args.dir, "home"), "bench-0123456789ab"
    t0 = time.perf_counter()
    shape = make_cache(home, key, args.mb)
    made = time.perf_counter() - t0
    print(f"cache: {shape['files']} files, {shape['bytes'] / 1e6:.0f} MB (written in {made:.1f}s)")
    results = {}
    for link in (True, False):
        name = "hard links" if link else "copy"
        takes, restores, overs = [], [], []
        for _ in range(args.reps):
            takes.append(timed(lambda: snapshots.take(home, key, keep=1, link=link)))
            envs.remove_tree(envs.cache_dir(home, key))  # `gpujob cache clear`: the automatic case
            restores.append(timed(lambda: snapshots.restore(home, key, link=link)))
            overs.append(timed(lambda: snapshots.restore(home, key, link=link)))  # over a live cache
        meta = snapshots.listing(home, key)[0]
        results[name] = {"snapshot_s": statistics.median(takes), "restore_s": statistics.median(restores),
                         "restore_over_live_s": statistics.median(overs),
                         "snapshot_runs": [round(x, 3) for x in takes],
                         "restore_runs": [round(x, 3) for x in restores],
                         "restore_over_live_runs": [round(x, 3) for x in overs], "linked": meta["linked"]}
        print(f"{name:>10}: snapshot {results[name]['snapshot_s']:.2f}s, restore into a cleared cache "
              f"{results[name]['restore_s']:.2f}s, restore over a live cache (deletes it) "
              f"{results[name]['restore_over_live_s']:.2f}s "
              f"(median of {args.reps}; {meta['linked']} of {meta['files']} files linked)")
    usage = subprocess.run(["du", "-sh", os.path.join(home, "snapshots")], capture_output=True,
                           text=True).stdout
    print(f"disk used by the last (copied) snapshot: {usage.split()[0] if usage else '?'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": shape, "results": results}, f, indent=1)
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
