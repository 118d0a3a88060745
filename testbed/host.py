"""The machine the bed runs on: the tools it needs (installed with apt-get when missing),
its paths, the bed's error and log line, and an ``rm -rf`` that minds mounts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BED_PREFIX = "gpujob-tb-"
BED_PARENT = Path(tempfile.gettempdir())
MARKER = "GPUJOB_TESTBED"        # env var NAME=<bed root> carried by every bed process
SSHD = "/usr/sbin/sshd"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Binaries the bed needs -> the Debian package that ships them.
HOST_TOOLS = {
    "/usr/sbin/sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "lxc-start": "lxc",
    "lxc-attach": "lxc",
    "lxc-stop": "lxc",
    "lxc-info": "lxc",
    "debootstrap": "debootstrap",
}


class TestBedError(RuntimeError):
    """The bed could not be brought up (the message says why)."""


def log(msg: str) -> None:
    if os.environ.get("GPUJOB_TESTBED_QUIET") != "1":
        print(f"[testbed] {msg}", file=sys.stderr, flush=True)


def which(tool: str) -> str | None:
    if tool.startswith("/"):
        return tool if os.access(tool, os.X_OK) else None
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":" + HOST_PATH)


def ensure_host_tools() -> None:
    """apt-get install openssh-server/lxc/debootstrap when one of their binaries is missing."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise TestBedError(f"missing {', '.join(missing)} and not root to install them")
    pkgs = sorted(set(missing) | {"openssh-server", "openssh-client", "lxc", "debootstrap"})
    log(f"installing {' '.join(pkgs)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update"],
                 ["apt-get", "install", "-y", "--no-install-recommends", *pkgs]):
        r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if r.returncode != 0:
            raise TestBedError(f"{' '.join(argv)} failed (exit {r.returncode}):\n"
                               + r.stdout[-3000:])
    still = sorted(t for t in HOST_TOOLS if which(t) is None)
    if still:
        raise TestBedError(f"still missing after apt-get install: {', '.join(still)}")


def mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                mp = line.split()[1].replace("\\040", " ")
                if mp == str(path) or mp.startswith(prefix):
                    out.append(mp)
    except OSError:
        pass
    return out


def safe_rmtree(path: Path) -> None:
    """rm -rf that first lazily unmounts anything mounted below ``path``
    (an interrupted debootstrap leaves proc/sys mounted in its target)."""
    path = Path(path)
    for mp in sorted(mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    if mounts_under(path):
        raise TestBedError(f"refusing to remove {path}: still has mounts")
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():  # e.g. immutable bits, races: try the blunt tool once
            subprocess.run(["rm", "-rf", "--one-file-system", str(path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
