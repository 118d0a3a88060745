"""Tiny wheel profiles for the offline demo and the tests.

One package, ``gpujob-demo-kernels``, published in two builds the way PyTorch
publishes ``+cu128`` and ``+cu130``: ``1.0.0+fast`` and ``1.0.0+slow``, each in
its own PEP 503 index (``<root>/fast/simple/``, ``<root>/slow/simple/``). The
demo trainer's speed depends on which build its venv holds, so a wheel swap
shows up in tokens/s exactly as in the field. Served from disk (``file://``) or
over HTTP on loopback (:func:`serve`).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

PACKAGE = "gpujob-demo-kernels"
MODULE = "demo_kernels"
BUILDS = {"fast": 12800.0, "slow": 4300.0}  # tok/s of the demo trainer, from the seeds
VERSION = "1.0.0"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dest: Path, build: str, speed: float, version: str = VERSION, *,
                package: str = PACKAGE, module: str = MODULE, body: str = "") -> Path:
    """Write ``gpujob_demo_kernels-<version>+<build>-py3-none-any.whl`` into ``dest``
    (another ``package``/``module`` name, with ``body`` appended, for the tests)."""
    full = f"{version}+{build}" if build else version
    dist = f"{package.replace('-', '_')}-{full}"
    files = {
        f"{module}/__init__.py": (f'"""Demo kernels, build {build}."""\n'
                                  f"BUILD = {build!r}\nTOKENS_PER_SECOND = {speed!r}\n"
                                  f"__version__ = {full!r}\n{body}").encode(),
        f"{dist}.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: {package}\nVersion: {full}\n"
                                       f"Summary: gpujob demo kernels ({build} build)\n").encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpujob\nRoot-Is-Purelib: true\n"
                                   b"Tag: py3-none-any\n",
    }
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
    record += f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record.encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-py3-none-any.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    path.write_bytes(buf.getvalue())
    return path


def build_indexes(root: Path, builds: dict[str, float] | None = None) -> dict[str, Path]:
    """Create one PEP 503 simple index per build under ``root``; returns build → index dir."""
    out = {}
    for build, speed in (builds or BUILDS).items():
        wheel = build_wheel(root / build / "wheels", build, speed)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        proj = root / build / "simple" / PACKAGE
        proj.mkdir(parents=True, exist_ok=True)
        (root / build / "simple" / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="{PACKAGE}/">{PACKAGE}</a></body></html>\n')
        (proj / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="../../wheels/{wheel.name}#sha256={digest}">'
            f"{wheel.name}</a></body></html>\n")
        out[build] = root / build / "simple"
    return out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(root: Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``root`` over HTTP on 127.0.0.1 in a daemon thread; returns (server, base URL)."""
    handler = lambda *a, **kw: _Quiet(*a, directory=str(root), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
