"""The rollback switch on this machine (no test bed): decision → the known-good trainer.

``python -m bench.rollback_local`` submits bench's rollback job (starts on ``slow``,
whose throughput breaches the floor, rolls back to ``fast`` with its venv prebuilt) to a
private ``local`` target and prints each job's ``rollback_done.took`` (what ``python -m
bench``'s "rollback" figure reads in the container) and the events between the decision
and the trainer's start with their times, to see what the switch spends.

    python -m bench.rollback_local --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.supervisor_cpu import JOB_DIR, Local  # noqa: E402


class Rollbacks(Local):
    def rollback_spec(self, profile: str = "slow", lines: int = 40) -> Path:
        spec = {
            "name": "bench", "target": "lab/box",
            "sync": [{"src": str(JOB_DIR), "dest": ".", "exclude": ["__pycache__", "checkpoint.json*"]}],
            "gpus": {"target": [0, 1], "drafter": [2, 3]},
            "profiles": [{"name": n, "index_url": self.urls[n],
                          "packages": [f"gpujob-demo-kernels==1.0.0+{n}"]}
                         for n in ("fast", "slow")],
            "profile": profile,
            "warmup": {"command": "python warmup.py", "per_gpu": "drafter", "timeout": "1m"},
            "train": {"command": f"python trainer.py --lines {lines} --rate 40", "resume_args": ["--resume"],
                      "grace": "3s"},
            "throughput": {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2,
                           "no_data_timeout": "30s", "good_after": "1s"},
        }
        path = self.tmp / f"{profile}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def one(self, spec: Path) -> dict:
        job = self.submit(spec)
        end = time.monotonic() + 120
        while time.monotonic() < end and self.state(job).get("state") not in ("succeeded", "failed",
                                                                              "stopped"):
            time.sleep(0.1)
        st = self.state(job)
        ev = [json.loads(x) for x in (self.job_dir(job) / "events.jsonl").read_text().splitlines()
              if x.strip()]
        done = [e for e in ev if e["type"] == "rollback_done"]
        if st.get("state") != "succeeded" or not done:
            raise RuntimeError(f"job {job} ended {st.get('state')} without a rollback: {st.get('reason')}")
        t0 = done[-1]["decided_at"]
        steps = [(round((e.get("t") or e.get("at") or t0) - t0, 4), e["type"]) for e in ev
                 if (e.get("t") or e.get("at") or 0) >= t0 - 1e-6][:40]
        return {"job": job, "took": done[-1]["took"], "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rollback_local", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", action="store_true", help="print the events after each decision")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-rollback-"))
    loc = Rollbacks(tmp)
    try:
        good = loc.submit(loc.rollback_spec("fast", 120))  # fast held for good_after: known-good
        end = time.monotonic() + 120
        while time.monotonic() < end and loc.state(good).get("state") not in ("succeeded", "failed",
                                                                              "stopped"):
            time.sleep(0.1)
        spec = loc.rollback_spec()
        runs = []
        for _ in range(args.reps):
            r = loc.one(spec)
            runs.append(r)
            print(f"rollback took {r['took'] * 1000:.1f} ms, load {os.getloadavg()[0]:.2f}", flush=True)
            if args.steps:
                for t, kind in r["steps"]:
                    print(f"  +{t * 1000:8.1f} ms  {kind}")
        med = statistics.median(r["took"] for r in runs)
        print(f"median {med * 1000:.1f} ms over {len(runs)}")
        if args.json:
            Path(args.json).write_text(json.dumps({"took_s": [r["took"] for r in runs], "median_s": med,
                                                   "load": os.getloadavg()}, indent=1))
    finally:
        loc.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
