"""The agent's file commands (stdlib only): ``probe`` (what the container has),
``put`` (one file from stdin), ``manifest`` (what was shipped already) and the
bounded tar extraction ``submit`` uses."""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile

from gpujob.agent.home.journal import Home
from gpujob.agent.base.fsio import temp_beside
from gpujob.agent.base.wire import (BadShape, Code, ManifestAnswer, ManifestRequest, ProbeAnswer, PutAnswer,
                                    Refused)
from gpujob.agent.verbs.lifecycle import emit, expand


def cmd_probe(home: Home, args) -> None:
    info: dict = {"python": platform.python_version(), "machine": platform.machine(),
                  "system": platform.system(), "home": home.root, "pid": os.getpid()}
    try:
        import ensurepip  # noqa: F401  (Debian ships it in python3-venv)
        import venv  # noqa: F401
        info["venv"] = True
    except ImportError:
        info["venv"] = False
    uv = home.path("bin", "uv")
    info["uv"] = uv if os.access(uv, os.X_OK) else shutil.which("uv")
    probe_dir = expand(args.workdir) if args.workdir else home.root
    while not os.path.exists(probe_dir):
        probe_dir = os.path.dirname(probe_dir)
    st = os.statvfs(probe_dir)
    info["disk_free"] = st.f_bavail * st.f_frsize
    info["disk_path"] = probe_dir
    info["uvm"] = os.path.exists("/dev/nvidia-uvm")
    try:
        with open("/proc/driver/nvidia/version") as f:
            info["proc_driver"] = f.read().strip()
    except OSError:
        info["proc_driver"] = None
    smi = shutil.which("nvidia-smi")
    info["nvidia_smi"] = None
    if smi:
        try:
            p = subprocess.run([smi, "--query-gpu=index,name,driver_version,utilization.gpu",
                                "--format=csv,noheader,nounits"], capture_output=True, timeout=30)
            rows = [[c.strip() for c in ln.split(",")] for ln in p.stdout.decode().splitlines() if ln.strip()]
            info["nvidia_smi"] = {"ok": p.returncode == 0, "gpus": rows,
                                  "error": p.stderr.decode().strip()[-300:]}
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi"] = {"ok": False, "gpus": [], "error": str(e)}
    emit(ProbeAnswer.from_dict(info))


def cmd_put(home: Home, args) -> None:
    dest = expand(args.dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = temp_beside(dest, int(args.mode, 8))
    try:
        with open(fd, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    emit(PutAnswer(dest, os.path.getsize(dest)))


def manifest(root: str, names: list) -> dict:
    """{relative path: [size, mtime seconds]} of those of ``names`` that are files under
    ``root``: only what the controller would ship is looked at, so the answer is as large as
    the laptop's tree, never as large as what the trainer wrote there (a workdir of 100k
    outputs once passed the controller's 8 MiB answer cap). A name that is not a plain
    relative path is not answered for (it is shipped, and untar judges it)."""
    out = {}
    for rel in names:
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel \
                or ".." in rel.split("/"):
            continue
        try:
            st = os.lstat(os.path.join(root, rel))
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode):
            out[rel] = [st.st_size, int(st.st_mtime)]
    return out


def cmd_manifest(home: Home, args) -> None:
    """stdin: ``wire.ManifestRequest``, the files the controller has for each dest."""
    workdir = home.workdir({"name": args.name, "workdir": args.workdir})
    try:
        asked = ManifestRequest.from_dict(json.loads(sys.stdin.buffer.read() or b"{}")).files
    except (ValueError, BadShape) as e:
        raise Refused(f"manifest: {e}", Code.BAD_REQUEST) from None
    emit(ManifestAnswer({d: manifest(os.path.join(workdir, d), asked.get(d) or []) for d in args.dests}))


def untar(stream, size: int, dest: str) -> int:
    """Unpack ``size`` bytes of tar from ``stream`` into ``dest``; refuses members that
    would land outside it."""
    os.makedirs(dest, exist_ok=True)
    body = _Limited(stream, size)
    count = 0
    # a stream ("r|") is only read; typeshed asks every mode's fileobj for write, seek, tell, close
    with tarfile.open(fileobj=body, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            target = os.path.realpath(os.path.join(dest, member.name))
            if not (target == os.path.realpath(dest) or target.startswith(os.path.realpath(dest) + os.sep)) \
                    or member.issym() or member.islnk() or member.isdev():
                raise ValueError(f"refusing tar member {member.name!r}")
            member.mode &= 0o777  # never setuid, setgid or sticky, whatever the laptop had
            tar.extract(member, dest, set_attrs=True,
                        **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            count += 1
    body.drain()
    return count


class _Limited:
    def __init__(self, stream, size):
        self.stream, self.left = stream, size

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.stream.read(n)
        self.left -= len(data)
        return data

    def drain(self):
        while self.read(1 << 16):
            pass
