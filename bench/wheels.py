"""Real wheels, measured (issue 15, part 8): two profiles holding real torch builds
from the package registry, built by gpujob into a local container home.

    python -m bench.wheels --out wheels.json [--index https://download.pytorch.org/whl/cpu]
        [--pins torch==2.13.0+cpu torch==2.14.1]

For each profile: the cold build (empty uv cache: download + install) and the
build again from uv's cache (the venv removed, the cache kept), so the download is
the difference; the disk of both venvs together, apparent and real (uv links files
from its cache); the switch time (a manual rollback of a running job to the other,
installed profile: decision -> trainer running). Needs the network; run it once,
outside CI. Every figure goes to the JSON as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TRAINER = ("import sys, time\nfrom importlib import metadata\nprint(sys.argv[1], metadata.version(sys.argv[1]), flush=True)\n"
           "for i in range(100000):\n    time.sleep(0.2)\n    print(f'step {i} | 12.8K tok/s', flush=True)\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wheels")
    p.add_argument("--out", default="bench-wheels.json")
    p.add_argument("--index", default="https://download.pytorch.org/whl/cpu")
    p.add_argument("--pins", nargs=2, default=["torch==2.13.0+cpu", "torch==2.14.1"])
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-bench-wheels-"))
    fig: dict = {"status": "running", "index": args.index, "pins": args.pins}

    def save(**kw):
        fig.update(kw)
        Path(args.out).write_text(json.dumps(fig, indent=2))
    root = tmp / "root"
    (tmp / "code").mkdir()
    (tmp / "code" / "trainer.py").write_text(TRAINER)
    hosts = tmp / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {"box": {"root": str(root)}}}}}))
    env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"), COLUMNS="160")
    names = ["a", "b"]
    spec = {"name": "wheels", "target": "box", "sync": [{"src": str(tmp / "code"), "dest": "."}],
            "profiles": [{"name": n, "index_url": args.index, "packages": [pin]} for n, pin in zip(names, args.pins)],
            "train": {"command": f"python trainer.py {args.pins[0].split('==')[0]}", "grace": "5s"}}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(spec))

    def cli(*a, timeout=1800, check=True):
        r = subprocess.run([sys.executable, "-m", "gpujob.cli.main", *a], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise SystemExit(f"bench.wheels: gpujob {' '.join(a)} failed: {r.stdout[-800:]} {r.stderr[-800:]}")
        return r

    def build(profile: str) -> tuple:
        """Submit, wait for training, stop; the env_ready event's seconds and the job id."""
        r = cli("submit", str(path), "--profile", profile)
        job = re.search(r"^submitted (\S+) ", r.stdout, re.M).group(1)
        for _ in range(3600):
            st = json.loads(cli("status", job, "--json").stdout)
            if st["state"] in ("training", "failed", "succeeded", "stopped"):
                break
            time.sleep(0.5)
        if st["state"] != "training":
            raise SystemExit(f"bench.wheels: {job} ended {st['state']}: {st.get('reason')}")
        ev = [json.loads(x) for x in (root / "jobs" / job / "events.jsonl").read_text().splitlines()]
        ready = [e for e in ev if e["type"] == "env_ready"]
        return job, (ready[-1]["seconds"] if ready else None)

    try:
        builds = {}
        for n in names:
            job, cold = build(n)
            cli("stop", job)
            shutil.rmtree(next((root / "envs").glob(f"{n}-*")))  # the venv goes, uv's cache stays
            job, cached = build(n)
            cli("stop", job)
            builds[n] = {"cold_s": cold, "from_cache_s": cached,
                         "download_s": round(cold - cached, 2) if cold and cached else None}
            save(builds=builds)
        prof = json.loads(cli("profiles", "box", "--json").stdout)
        save(disk={"venvs": {e["profile"]: e["disk"] for e in prof["envs"]}, "together": prof["disk_total"],
                   "uv_cache": json.loads(cli("cache", "ls", "box", "--json").stdout)["uv_cache"]})
        job, _ = build("a")
        time.sleep(2)
        cli("rollback", job, "--to", "b")
        for _ in range(600):
            st = json.loads(cli("status", job, "--json").stdout)
            rb = (st.get("rollbacks") or [{}])[-1]
            if rb.get("took") is not None and st["state"] == "training":
                break
            time.sleep(0.2)
        cli("stop", job)
        save(switch={"took_s": rb.get("took"), "timings": rb.get("timings")}, status="done")
    finally:
        if fig.get("status") != "done":
            save(status="failed")
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
