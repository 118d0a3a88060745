"""The container's root filesystem: a Debian rootfs built once with debootstrap and cached
(a build goes into a temporary dir and is renamed into place only when complete), and each
bed's own writable rootfs over it (an overlay, or a copy), with its PID 1."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.host import HOST_PATH, TestBedError, ensure_host_tools, log, mounts_under, safe_rmtree

SUITE = "bookworm"
INCLUDE = ("python3", "python3-venv", "procps", "ca-certificates")
MIRROR = os.environ.get("GPUJOB_TESTBED_MIRROR", "http://deb.debian.org/debian")
CACHE_DIR = Path(os.environ.get("GPUJOB_TESTBED_CACHE", "/var/cache/gpujob-testbed"))
# Bump when the post-debootstrap processing of the cached rootfs changes.
ROOTFS_VERSION = 1

# PID 1 of the running container. Unlike `sleep infinity` it reaps orphans, so a
# double-forked daemon that exits does not linger as a zombie (which would make
# `kill -0 PID` lie about it being alive).
CONTAINER_INIT = '''\
#!/usr/bin/python3 -IS
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
# the end of boot, as systemd's rc-local.service and sysvinit do it: an executable
# /etc/rc.local runs once
if os.access("/etc/rc.local", os.X_OK) and os.fork() == 0:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
    os.execve("/etc/rc.local", ["/etc/rc.local"],
              {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8"})
while True:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    sig = signal.sigwait({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
    if sig != signal.SIGCHLD:
        os._exit(0)
'''
CONTAINER_INIT_PATH = "/sbin/gpujob-tb-init"


def rootfs_cache_path() -> Path:
    key = hashlib.sha256(repr((SUITE, INCLUDE, MIRROR, ROOTFS_VERSION)).encode()).hexdigest()[:10]
    return CACHE_DIR / f"rootfs-{SUITE}-v{ROOTFS_VERSION}-{key}"


def _trim_rootfs(rootfs: Path) -> None:
    """Drop what a test container never needs (halves the per-bed copy)."""
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                "usr/share/man", "usr/share/info", "usr/share/locale"):
        d = rootfs / rel
        if not d.is_dir():
            continue
        for child in d.iterdir():
            if child.name in ("partial", "lock"):
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    for p in (rootfs / "var/cache/apt").glob("*.bin"):
        p.unlink(missing_ok=True)


def lock_holder(fd: int) -> int | None:
    """The pid that holds a flock on the file open at ``fd`` (from /proc/locks), if known."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if "->" in parts:  # a waiter's line (`1: -> FLOCK ...`), not the holder's
                    continue
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == dev:
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def lock_saying_so(lock, path: Path, what: str) -> None:
    """flock ``lock`` exclusively; when another process holds it, one line first: what is
    waited for (the lock's path, its holder's pid when known), never a silent minute."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pid = lock_holder(lock.fileno())
        held = f"held by pid {pid}" if pid else "its holder unknown"
        log(f"waiting for the lock {path} ({held}: {what}) ...")
    fcntl.flock(lock, fcntl.LOCK_EX)
    log(f"got the lock {path}")


def ensure_rootfs() -> tuple[Path, float]:
    """Return (path of the cached rootfs, seconds spent building it: 0.0 when cached).

    Built with debootstrap into a temp dir next to the cache and renamed into
    place when complete; a lock serialises concurrent builders.
    """
    final = rootfs_cache_path()
    if (final / "usr/bin/python3").exists():
        return final, 0.0
    ensure_host_tools()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / ".lock", "w") as lock:
        lock_saying_so(lock, CACHE_DIR / ".lock", "a rootfs build")
        if (final / "usr/bin/python3").exists():
            return final, 0.0
        # leftovers of interrupted builds (we hold the lock, so nobody is building)
        for stale in CACHE_DIR.glob(".build-*"):
            safe_rmtree(stale)
        if final.exists():  # incomplete, should not happen (rename is atomic)
            safe_rmtree(final)
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=CACHE_DIR))
        target = tmp / "rootfs"
        build_log = tmp / "debootstrap.log"
        argv = ["debootstrap", "--variant=minbase", "--include=" + ",".join(INCLUDE),
                SUITE, str(target), MIRROR]
        log(f"building the container rootfs (first run, ~1 min): {' '.join(argv)}")
        try:
            with open(build_log, "w") as lf:
                r = subprocess.run(argv, stdout=lf, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, PATH=HOST_PATH,
                                            DEBIAN_FRONTEND="noninteractive"))
            if r.returncode != 0 or not (target / "usr/bin/python3").exists():
                tail = build_log.read_text(errors="replace")[-3000:]
                raise TestBedError(f"debootstrap failed (exit {r.returncode}):\n{tail}")
            if mounts_under(target):
                raise TestBedError(f"debootstrap left mounts under {target}")
            _trim_rootfs(target)
            (target / "root").mkdir(mode=0o700, exist_ok=True)
            os.rename(target, final)
        finally:
            safe_rmtree(tmp)
        took = time.monotonic() - t0
        log(f"rootfs cached at {final} in {took:.1f}s")
        return final, took


def per_bed_rootfs(cached: Path, ct: Path, rootfs: Path) -> str:
    """Give the bed its own writable rootfs: an overlay (cached rootfs as the
    read-only lower layer, writes go to ct/upper; ~10 ms) or, when overlayfs is
    unavailable or GPUJOB_TESTBED_ROOTFS=copy, a full copy (0.3-4 s here)."""
    if os.environ.get("GPUJOB_TESTBED_ROOTFS", "overlay") == "overlay":
        upper, work = ct / "upper", ct / "work"
        for d in (upper, work, rootfs):
            d.mkdir()
        r = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={cached},upperdir={upper},workdir={work}", str(rootfs)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0:
            return "overlay"
        log(f"overlay mount failed ({r.stdout.strip()}); copying the rootfs instead")
        for d in (upper, work, rootfs):
            d.rmdir()
    r = subprocess.run(["cp", "-a", str(cached), str(rootfs)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise TestBedError(f"copying the rootfs failed: {r.stdout[-2000:]}")
    return "copy"


def prepare_rootfs(rootfs: Path, name: str) -> None:
    """Name the container, give it the host's resolv.conf and its PID 1."""
    (rootfs / "root").mkdir(mode=0o700, exist_ok=True)
    (rootfs / "etc/hostname").write_text(name + "\n")
    hosts = rootfs / "etc/hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n"
                     "::1\tlocalhost ip6-localhost ip6-loopback\n")
    try:
        resolv = Path("/etc/resolv.conf").read_text()
    except OSError:
        resolv = ""
    dst = rootfs / "etc/resolv.conf"
    if dst.is_symlink():
        dst.unlink()
    dst.write_text(resolv)
    init = rootfs / CONTAINER_INIT_PATH.lstrip("/")
    init.write_text(CONTAINER_INIT)
    init.chmod(0o755)
