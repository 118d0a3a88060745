"""The GPU benchmark of issue 36: `gpujob bisect` on a real trainer (jobs/dflash-mini.yaml's
DFlash-like drafter, flex_attention compiled) on the ``local`` target.

The good profile is dflash-mini's ``fast`` plus five harmless pins (bis-a .. bis-e 1.0, tiny
wheels from a file:// index built here: the GPU box needs no network); the bad one moves all
five pins to 2.0 and adds ``TORCHDYNAMO_DISABLE=1`` (on CPU, ``DFLASH_CPU_STEP_DELAY``: a
smoke test), which makes flex_attention eager: one slow change among six. The figures: each
trial (label, verdict, steady median and spread, ratio, seconds), the answer, the trials and
minutes in all, whether the culprit was named within ceil(log2 6) + 2 = 5 trials.

    GPUJOB_BASE_PYTHON=/opt/torch/.venv/bin/python3 python3 -m bench.bisect_gpu --gpus 0 \\
        --out bench/bisect-gpu-2026-12-04.json
    python3 -m bench.bisect_gpu --device cpu --small --plan     # the spec and the plan; runs nothing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu import PASSTHROUGH, REPO, make_spec, probe_torch

PACKAGES = "abcde"


def build_index(root: Path) -> str:
    """bis-a .. bis-e in 1.0 and 2.0 (no speed of their own), a PEP 503 index; its file: URL."""
    from gpujob.ops.wheelhouse import build_wheel
    for x in PACKAGES:
        proj = root / "simple" / f"bis-{x}"
        proj.mkdir(parents=True, exist_ok=True)
        links = []
        for v in ("1.0", "2.0"):
            w = build_wheel(root / "wheels", "", 0.0, v, package=f"bis-{x}", module=f"bis_{x}")
            digest = hashlib.sha256(w.read_bytes()).hexdigest()
            links.append(f'<a href="../../wheels/{w.name}#sha256={digest}">{w.name}</a>')
        (proj / "index.html").write_text("\n".join(links) + "\n")
    return (root / "simple").as_uri()


def bisect_spec(args, tmp: Path, info: dict) -> Path:
    import yaml
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    path = make_spec(args, tmp, gpus, info)
    spec = yaml.safe_load(path.read_text())
    url = build_index(tmp / "index")
    fast = next(p for p in spec["profiles"] if p["name"] == "fast")
    slow_env = {"TORCHDYNAMO_DISABLE": "1"} if args.device == "cuda" else {"DFLASH_CPU_STEP_DELAY": "0.05"}
    good = dict(fast, name="good", index_url=url, packages=[f"bis-{x}==1.0" for x in PACKAGES])
    bad = dict(fast, name="bad", index_url=url, packages=[f"bis-{x}==2.0" for x in PACKAGES],
               env=dict(fast.get("env") or {}, **slow_env))
    spec["profiles"], spec["profile"] = [good, bad], "good"
    spec.pop("rollback", None)  # trials run with rollback off anyway; its fallback named fast/slow
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bisect_gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default="0")
    p.add_argument("--out", default="bench-bisect-gpu.json")
    p.add_argument("--python", default=os.environ.get("GPUJOB_BASE_PYTHON") or sys.executable)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small", action="store_true")
    p.add_argument("--train-seconds", type=float, default=300.0, help="the trainer's --time-limit")
    p.add_argument("--trial-time", default="90s")
    p.add_argument("--deadline", type=float, default=560.0, help="seconds for the bisect (the device's "
                   "10-minute command limit; trials left running end on their own train timeout)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--plan", action="store_true", help="print the spec and bisect --plan; run nothing")
    args = p.parse_args(argv)
    info = {"torch": None, "cuda": None, "driver": None, "names": []} if args.plan else \
        probe_torch(args.python, args.device)
    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="gpujob-bench-bisect-"))
    tmp.mkdir(parents=True, exist_ok=True)
    hosts = tmp / "hosts.yaml"
    hosts.write_text(json.dumps({"hosts": {"lab": {"kind": "local", "env_passthrough": PASSTHROUGH,
                                                   "containers": {"box": {"root": str(tmp / "root")}}}}}))
    env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"), COLUMNS="160",
               UV_OFFLINE="1", UV_PYTHON_DOWNLOADS="never", PYTHONUNBUFFERED="1")
    spec = bisect_spec(args, tmp, info)
    argv_ = [sys.executable, "-m", "gpujob.cli.main", "bisect", str(spec), "--good", "good", "--bad", "bad",
             "--trial-time", args.trial_time]
    if args.plan:
        print(spec.read_text())
        return subprocess.run(argv_ + ["--plan"], env=env, cwd=REPO).returncode
    t0 = time.time()
    try:
        proc = subprocess.run(argv_ + ["--json"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              timeout=args.deadline)
    except subprocess.TimeoutExpired:
        Path(args.out).write_text(json.dumps({"machine": info, "exit": "timeout", "deadline": args.deadline})
                                  + "\n")
        print(f"bisect ran past --deadline {args.deadline:g}s")
        return 1
    out = {"machine": info, "device": args.device, "seconds": round(time.time() - t0, 1),
           "exit": proc.returncode}
    if proc.returncode == 0:
        res = json.loads(proc.stdout)
        n = len(res["trials"])
        culprit = "env TORCHDYNAMO_DISABLE (none) -> 1" if args.device == "cuda" else \
            "env DFLASH_CPU_STEP_DELAY (none) -> 0.05"
        out.update(result=res, trials=n, minutes=round(res["seconds"] / 60, 1),
                   named=res["culprit"] == [culprit],
                   within_bound=n <= math.ceil(math.log2(len(res["changes"]))) + 2)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out.get(k) for k in ("exit", "trials", "minutes", "within_bound", "named")}))
    return 0 if proc.returncode == 0 and out.get("named") else 1


if __name__ == "__main__":
    sys.exit(main())
