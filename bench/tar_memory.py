"""Laptop memory while shipping code: ``python -m bench.tar_memory [--mb 1024]``.

Ships one sparse file of ``--mb`` MB (reading it costs no disk) plus a small one, the
way ``submit`` does (the job line, then the tar, into a transport's stdin; here the
local transport into ``wc -c``), in a fresh process, and reports its peak RSS:

ours      ``tarstream.TarStream`` (the tar is produced while it is sent)
baseline  the tar built whole in memory first (``tarfile`` into a ``BytesIO``, what
          ``jobs.tar_of`` did before issue 10)

The goal (issue 10): 1 GB with < 100 MB RSS.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SHIP = """\
import io, re, sys, tarfile
from pathlib import Path
from gpujob.ops.tarstream import Concat, TarStream
from gpujob.transport.local import LocalTransport
hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) // 1024
src, how = Path(sys.argv[1]), sys.argv[2]
if how == "ours":
    body = TarStream(src, ["big.bin", "small.py"])
else:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("big.bin", "small.py"):
            tar.add(str(src / name), arcname=name)
    body = buf.getvalue()
r = LocalTransport().run(["wc", "-c"], stdin=Concat([b'{"job": 1}\\n', body]))
print(int(r.stdout.split()[0]), hwm())
"""


def measure(src: Path, how: str) -> tuple[int, int]:
    p = subprocess.run([sys.executable, "-c", SHIP, str(src), how], capture_output=True, check=True,
                       cwd=str(REPO), timeout=600)
    sent, rss = map(int, p.stdout.split())
    return sent, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        with open(src / "big.bin", "wb") as f:
            f.truncate(args.mb << 20)
        (src / "small.py").write_text("print(1)\n")
        ours_sent, ours = measure(src, "ours")
        base_sent, base = measure(src, "baseline")
    print(f"shipped {ours_sent >> 20} MiB (baseline {base_sent >> 20} MiB)")
    print(f"peak RSS: ours {ours} MiB, baseline {base} MiB, ratio {base / ours:.1f}x; "
          f"goal < 100 MiB: {'met' if ours < 100 else 'MISSED'}")


if __name__ == "__main__":
    main()
