"""Ending a bed: stop its sshd's and containers, kill whatever of it is left, remove its
dir; and ``clean``: the beds whose owner is gone, and interrupted rootfs builds."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from testbed.host import BED_PARENT, BED_PREFIX, log, safe_rmtree
from testbed.lxc import lxc, lxc_state
from testbed.procs import alive, bed_processes, kill_all, proc_stat, read
from testbed.rootfs import CACHE_DIR


def teardown_dir(root: Path) -> None:
    """Stop everything of the bed at ``root`` and remove the dir. Idempotent."""
    root = Path(root)
    meta = {}
    try:
        meta = json.loads((root / "bed.json").read_text())
    except (OSError, ValueError):
        pass
    # 1. the listening sshd's: no new sessions
    for pid in meta.get("sshd_pids", []):
        st = proc_stat(pid)
        if st and root.as_posix().encode() in read(f"/proc/{pid}/cmdline"):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    # 2. containers
    lxcpath = root / "lxc"
    if lxcpath.is_dir():
        for ct in sorted(lxcpath.iterdir()):
            if (ct / "config").exists() and lxc_state(lxcpath, ct.name) != "STOPPED":
                try:
                    lxc("lxc-stop", "-P", str(lxcpath), "-n", ct.name, "-k", timeout=20)
                except subprocess.TimeoutExpired:
                    pass
    # 3. whatever is left: sessions, lxc-attach, orphans, monitors
    kill_all(lambda: bed_processes(root))
    # 4. the files
    safe_rmtree(root)


def clean_stale(force: bool = False) -> list[Path]:
    """Tear down beds under the temp dir whose owner process is gone (all beds with
    force=True), and leftovers of interrupted rootfs builds. Returns removed dirs."""
    removed = []
    for root in sorted(BED_PARENT.glob(BED_PREFIX + "*")):
        if not root.is_dir():
            continue
        try:
            meta = json.loads((root / "bed.json").read_text())
            owner_alive = alive(meta.get("owner_pid"), meta.get("owner_start"))
        except (OSError, ValueError):
            # no metadata: crashed very early; leave fresh ones alone (may be starting)
            owner_alive = time.time() - root.stat().st_mtime < 120
        if owner_alive and not force:
            continue
        log(f"removing {root}")
        teardown_dir(root)
        removed.append(root)
    if CACHE_DIR.is_dir():
        try:
            with open(CACHE_DIR / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                for stale in CACHE_DIR.glob(".build-*"):
                    log(f"removing {stale}")
                    safe_rmtree(stale)
                    removed.append(stale)
        except BlockingIOError:
            log("a rootfs build is in progress; leaving its temp dir alone")
    return removed
