"""The checkpoint watch on a huge tree (issue 33 item 7, issue 35 row 3): a stand-in trainer
(a fixed amount of CPU work with a save every second, renamed into place) runs while the
supervisor's watch (agent/home/ckregister.CkWatch, polled as the watch loop polls it) looks
at a glob over a tree of 10 files, then of 100k files. The figures: the trainer's wall time
on the big tree over the small one (goal <= 1.10) and the watch's CPU per second of run.

    python -m bench.cktree [--files 100000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from gpujob.agent.home import ckregister

TRAINER = r"""
import os, sys, time
out = sys.argv[1]
t0 = time.time()
for step in range(1, 41):
    x = 0
    for i in range(2_500_000):  # a fixed amount of work per step
        x += i * i
    with open(out + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(out + ".tmp", out)
print(round(time.time() - t0, 3))
"""


def run(files: int) -> dict:
    with tempfile.TemporaryDirectory() as top:
        tree = os.path.join(top, "tree")
        os.makedirs(tree)
        for i in range(files):
            os.close(os.open(os.path.join(tree, f"f{i:06d}.bin"), os.O_CREAT | os.O_WRONLY, 0o644))
        time.sleep(1.0)
        w = ckregister.CkWatch.begin(os.path.join(top, "home"), "j-1", "j", "p", os.path.join(tree, "*"), top,
                                     True, 0.3, None, time.time())
        cpu0 = time.thread_time()
        p = subprocess.Popen([sys.executable, "-c", TRAINER, os.path.join(tree, "ckpt.pt")],
                             stdout=subprocess.PIPE)
        start = time.monotonic()
        looks = 0
        while p.poll() is None:
            before = w.last_poll
            w.poll(time.time())
            looks += w.last_poll != before
            time.sleep(0.2)  # the watch loop's check interval
        wall = time.monotonic() - start
        cpu = time.thread_time() - cpu0
        w.poll(time.time(), force=True)
        w.close(time.time(), clean=p.returncode == 0)
        trainer_s = float(p.stdout.read().decode().strip() or 0)
        return {"files": files, "trainer_s": trainer_s, "wall_s": round(wall, 3),
                "watch_cpu_s": round(cpu, 3), "watch_cpu_share": round(cpu / wall, 4), "looks": looks,
                "finished": [e for e in w.reg["files"] if w.reg["files"][e].get("finished")] != []}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    small, big = run(10), run(a.files)
    res = {"small": small, "big": big, "trainer_ratio": round(big["trainer_s"] / small["trainer_s"], 3)}
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
