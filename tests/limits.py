"""Run one call in a forked child of this (preloaded) process under CPU-time and
address-space limits, and classify how it ended. Used by the fuzz test and by the
hostile-input tests, so that a case that would hang or eat memory on bad code fails
in seconds instead of taking the machine with it."""

from __future__ import annotations

import json
import os
import re
import resource
import select
import signal
import traceback
from dataclasses import dataclass

from gpujob.errors import GpujobError


def _vm_kb() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmSize:\s+(\d+)", f.read())[1])


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read())[1])


@dataclass
class Outcome:
    kind: str       # ok, error, traceback, hang, memory
    message: str    # the error's text (its hint on a second line), or the traceback
    rss_mb: float   # peak RSS of the child above the parent's RSS at fork time
    cpu_s: float


def run_limited(fn, *args, cpu_s: int = 2, extra_mb: int = 200, wall_s: float = 20) -> Outcome:
    """``fn(*args)`` in a forked child: at most ``cpu_s`` CPU seconds and ``extra_mb``
    more address space than this process has now."""
    base_rss = _rss_kb()
    limit = (_vm_kb() + extra_mb * 1024) * 1024
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            try:
                fn(*args)
                res = ["ok", ""]
            except GpujobError as e:
                res = ["error", e.message + (f"\n  hint: {e.hint}" if e.hint else "")]
            except MemoryError:
                res = ["memory", "MemoryError"]
            except BaseException:  # noqa: BLE001 - the point is to see every kind
                res = ["traceback", traceback.format_exc()[-3000:]]
            res[1] = res[1][:20000]  # a pipe's worth, and valid JSON
            os.write(w, json.dumps(res).encode())
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    killed = False
    try:
        while True:
            ready, _, _ = select.select([r], [], [], wall_s)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    _, status, usage = os.wait4(pid, 0)
    rss = max(0.0, (usage.ru_maxrss - base_rss) / 1024)
    cpu = usage.ru_utime + usage.ru_stime
    if killed or (os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL)):
        return Outcome("hang", f"killed after {cpu:.1f} CPU-s", rss, cpu)
    if not data:
        return Outcome("traceback", f"child died without an answer (status {status})", rss, cpu)
    kind, message = json.loads(data)
    return Outcome(kind, message, rss, cpu)
