"""A cold ``gpujob exec`` (issue 24: within 1.5x of ``ssh ... pct exec``) of two installs,
interleaved on one test bed: ``before`` (another checkout's console script) and
``after`` (this venv's). Per repetition: one ``ssh ... pct exec 200 -- true``; for each
install ``disconnect``, 2 s to settle, one cold ``exec`` (no daemon: it runs directly and
asks for one) with the inventory cache removed first (``cold_miss``: the first cold exec
after hosts.yaml changed), 4 s, ``disconnect``, 2 s, the same with that cache (``cold``), 4 s,
one ``exec`` on the daemon it asked for (that daemon's first request: it opens its connection),
one with ``GPUJOB_NO_DAEMON=1``. Wall and cpu (user + system of the process, wait4) medians, as
JSON on stdout.

    python -m bench.cold BEFORE_GPUJOB [REPS]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from testbed import TestBed  # noqa: E402

reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
scripts = {"before": sys.argv[1], "after": str(Path(sys.executable).parent / "gpujob")}
bed = TestBed.start()
tmp = Path(tempfile.mkdtemp(prefix="cold3-"))
envs = {}
try:
    inv = {"hosts": {"tb": {"address": "127.0.0.1", "port": bed.port, "user": "root",
                            "identity_file": str(bed.user_key), "known_hosts": str(bed.known_hosts),
                            "containers": {"ct200": {"vmid": bed.vmid, "home": "/root/gj-cold"}}}}}
    (tmp / "hosts.yaml").write_text(yaml.safe_dump(inv))
    for k in scripts:
        rt = tmp / f"run-{k}"
        rt.mkdir(mode=0o700)
        e = dict(os.environ, GPUJOB_HOSTS=str(tmp / "hosts.yaml"), XDG_STATE_HOME=str(tmp / "state"),
                 XDG_RUNTIME_DIR=str(rt))
        e.pop("GPUJOB_NO_DAEMON", None)
        envs[k] = e
    def t(argv, e):
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        _, st, ru = os.wait4(p.pid, 0)
        d = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(st) != 0:
            raise RuntimeError(p.stderr.read().decode()[-500:])
        return d, ru.ru_utime + ru.ru_stime
    ssh = bed.ssh_argv("pct", "exec", str(bed.vmid), "--", "true")

    def ex(k):
        return [scripts[k], "exec", "tb/ct200", "--", "true"]

    for k in scripts:
        t(ex(k), dict(envs[k], GPUJOB_NO_DAEMON="1")); t(ex(k), envs[k])
    S: dict = {}
    load_start = os.getloadavg()

    def add(name, v):
        S.setdefault(name, []).append(v[0])
        S.setdefault(name + "_cpu", []).append(v[1])
    for _ in range(reps):
        add("ssh", t(ssh, envs["after"]))
        for k in scripts:
            # the first cold exec after hosts.yaml changed: the inventory cache (gpujob/inventory/cache.py)
            # misses and the full validation runs (the same as cold for an install without one)
            subprocess.run([scripts[k], "disconnect"], env=envs[k], capture_output=True)
            for f in (tmp / f"run-{k}" / "gpujob").glob("inv-*.json"):
                f.unlink()
            time.sleep(2)
            add(f"cold_miss_{k}", t(ex(k), envs[k]))
            time.sleep(4)  # the daemon it asked for is up: disconnect finds it
            subprocess.run([scripts[k], "disconnect"], env=envs[k], capture_output=True)
            time.sleep(2)
            add(f"cold_{k}", t(ex(k), envs[k]))
            time.sleep(4)
            add(f"warm_{k}", t(ex(k), envs[k]))
            add(f"direct_{k}", t(ex(k), dict(envs[k], GPUJOB_NO_DAEMON="1")))
    med = {k: round(statistics.median(v) * 1000) for k, v in S.items()}
    print(json.dumps({"medians_ms": med, "ratios_vs_ssh": {k: round(med[k] / med["ssh"], 2) for k in med
                                                           if not k.endswith("_cpu")},
                      "load_start": load_start, "load": os.getloadavg(), "reps": reps, "scripts": scripts,
                      "samples_s": S}))
finally:
    for k in scripts:
        if k in envs:
            subprocess.run([scripts[k], "disconnect", "--all"], env=envs[k], capture_output=True)
    bed.stop()
