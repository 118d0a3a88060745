"""Issue 34 row 11: `scripts/testbed up` waited ~60 s on the rootfs cache's lock without a
word (another bed's rootfs build held it). Now it says what it waits for, in one line (the
lock's path and its holder's pid), then goes on once the holder is done. Through `python -m
testbed rootfs`, the step of `up` that takes that lock, with a cache dir of the test's own."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from testbed.rootfs import rootfs_cache_path

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import fcntl, os, sys
lock = open(sys.argv[1] + "/.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()   # the build: until the test says it is done
final = os.path.join(sys.argv[1], sys.argv[2], "usr", "bin")
os.makedirs(final)
open(os.path.join(final, "python3"), "w").close()
"""


def test_up_says_which_lock_it_waits_for_and_whose_then_goes_on(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    final = rootfs_cache_path().name  # its name does not depend on the cache dir
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(cache), final], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    waiter = None
    try:
        assert holder.stdout.readline() == "held\n"
        env = dict(os.environ, GPUJOB_TESTBED_CACHE=str(cache))
        env.pop("GPUJOB_TESTBED_QUIET", None)
        waiter = subprocess.Popen([sys.executable, "-m", "testbed", "rootfs"], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said, _, _ = select.select([waiter.stderr], [], [], 60)  # a guard against a hang, not a timing
        assert said, "it waited on the lock without a word"
        line = waiter.stderr.readline()  # the first thing it says, while it waits
        assert line == (f"[testbed] waiting for the lock {cache}/.lock (held by pid {holder.pid}: "
                        "a rootfs build) ...\n"), line
        time.sleep(0.5)
        assert waiter.poll() is None, "it did not wait for the holder"
        holder.stdin.write("done\n")
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
        out, rest = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, rest
        assert f"[testbed] got the lock {cache}/.lock" in rest
        assert out == f"{cache / final} (cached)\n"
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_no_line_when_nobody_holds_the_lock(tmp_path):
    cache = tmp_path / "cache"
    (cache / rootfs_cache_path().name / "usr" / "bin").mkdir(parents=True)
    (cache / rootfs_cache_path().name / "usr" / "bin" / "python3").touch()
    p = subprocess.run([sys.executable, "-m", "testbed", "rootfs"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, GPUJOB_TESTBED_CACHE=str(cache)), timeout=120)
    assert p.returncode == 0 and "waiting" not in p.stderr, p.stderr
