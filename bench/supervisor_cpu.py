"""Where the supervisor's CPU goes at 1,000 lines/s, on this machine (no test bed).

``python -m bench.supervisor_cpu`` submits the benchmark's streaming job (bench/job's
trainer: 1,000 time-stamped lines/s, every 10th a tok/s line) to a private ``local``
target and reads the supervisor's own CPU time (utime+stime from /proc/PID/stat) over
the train phase, as ``python -m bench`` does in the container. With ``--profile`` it
then runs one more supervisor of the same job in the foreground under cProfile with a
CPU-time clock (``time.process_time``: kernel time inside a call counts for it, a sleep
does not) and prints the functions that cost most.

    python -m bench.supervisor_cpu --seconds 20 --reps 3
    python -m bench.supervisor_cpu --seconds 10 --profile 25
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import shutil
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

from gpujob.wheelhouse import build_indexes, serve  # noqa: E402

JOB_DIR = REPO / "bench" / "job"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    rest = stat[stat.rfind(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


class Local:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        idx = tmp / "wheelhouse"
        build_indexes(idx)
        self.server, base = serve(idx)
        self.urls = {b: f"{base}/{b}/simple" for b in ("fast", "slow")}
        self.root = tmp / "root"
        hosts = tmp / "hosts.yaml"
        hosts.write_text(yaml.safe_dump({"hosts": {"lab": {"kind": "local", "containers": {
            "box": {"root": str(self.root)}}}}}))
        self.env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"),
                        COLUMNS="200", GPUJOB_NO_DAEMON="1")

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def spec(self, rate: float, seconds: float) -> Path:
        spec = {
            "name": "bench", "target": "lab/box",
            "sync": [{"src": str(JOB_DIR), "dest": ".", "exclude": ["__pycache__", "checkpoint.json*"]}],
            "gpus": {"target": [0, 1], "drafter": [2, 3]},
            "profiles": [{"name": "fast", "index_url": self.urls["fast"],
                          "packages": ["gpujob-demo-kernels==1.0.0+fast"]}],
            "profile": "fast",
            "train": {"command": f"python trainer.py --rate {rate:g} --seconds {seconds:g} --tps-every 10",
                      "resume_args": ["--resume"], "grace": "3s"},
            "throughput": {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2,
                           "no_data_timeout": "30s", "good_after": "1s"},
        }
        path = self.tmp / "stream.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def submit(self, spec: Path) -> str:
        p = subprocess.run([sys.executable, "-m", "gpujob.cli.main", "submit", str(spec), "--force"],
                           env=self.env, capture_output=True, cwd=str(REPO), timeout=300)
        m = re.search(rb"^submitted (\S+) ", p.stdout, re.M)
        if p.returncode or not m:
            raise RuntimeError(f"submit failed: {p.stdout[-1000:]!r} {p.stderr[-2000:]!r}")
        return m.group(1).decode()

    def job_dir(self, job: str) -> Path:
        found = list(self.root.glob(f"**/jobs/{job}"))
        if not found:
            raise RuntimeError(f"no job dir for {job} under {self.root}")
        return found[0]

    def state(self, job: str) -> dict:
        try:
            return json.loads((self.job_dir(job) / "state.json").read_text())
        except (OSError, ValueError, RuntimeError):
            return {}

    def measure(self, rate: float, seconds: float) -> dict:
        job = self.submit(self.spec(rate, seconds))
        end = time.monotonic() + 120
        while time.monotonic() < end:
            st = self.state(job)
            if st.get("phase") == "train" and st.get("child_pid"):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"job {job} never trained: {self.state(job)}")
        pid = int(st["supervisor_pid"])
        t_train = time.monotonic()
        time.sleep(min(1.0, seconds / 4))
        a = (time.monotonic(), cpu_of(pid))
        time.sleep(max(0.5, t_train + seconds - 0.5 - time.monotonic()))
        b = (time.monotonic(), cpu_of(pid))
        end = time.monotonic() + 60
        while time.monotonic() < end and self.state(job).get("state") not in ("succeeded", "failed", "stopped"):
            time.sleep(0.1)
        st = self.state(job)
        if st.get("state") != "succeeded":
            raise RuntimeError(f"job {job} ended {st.get('state')}: {st.get('reason')}")
        return {"job": job, "cpu_s": b[1] - a[1], "window_s": b[0] - a[0],
                "pct": (b[1] - a[1]) / (b[0] - a[0]) * 100}

    def profile(self, job: str, rate: float, seconds: float, top: int) -> str:
        """One more supervisor of ``job``'s spec, in this process, under cProfile (CPU clock)."""
        src = self.job_dir(job)
        home = src.parent.parent
        new = f"{job}-prof"
        dst = home / "jobs" / new
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir()
        jobj = json.loads((src / "job.json").read_text())
        jobj["spec"].pop("warmup", None)
        (dst / "job.json").write_text(json.dumps(jobj))
        # the state `agent submit` writes (without its step the first one, restore, is refused
        # as a jump from no step: the supervisor would go round its env step for good)
        (dst / "state.json").write_text(json.dumps({"job_id": new, "name": jobj["spec"]["name"], "state": "preparing",
                                                    "phase": "start", "step": "env", "profile": jobj["profile"],
                                                    "resume": False, "started_at": time.time()}))
        sys.path.insert(0, str(REPO))
        from gpujob.agent.supervisor import supervisor
        prof = cProfile.Profile(time.process_time)
        c0 = time.process_time()
        prof.enable()
        try:
            supervisor.run(str(home), new)
        finally:
            prof.disable()
        took = time.process_time() - c0
        st = json.loads((dst / "state.json").read_text())
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        return f"profiled supervisor: {took:.2f} CPU-s in all, ended {st.get('state')}\n" + out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.supervisor_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--profile", type=int, metavar="TOP", help="then profile one supervisor; show TOP rows")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-supcpu-"))
    loc = Local(tmp)
    try:
        runs = []
        for _ in range(args.reps):
            r = loc.measure(args.rate, args.seconds)
            runs.append(r)
            print(f"supervisor CPU {r['pct']:.2f} % of a core ({r['cpu_s']:.2f} CPU-s in {r['window_s']:.1f} s), "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
        if args.reps > 1:
            print(f"median {statistics.median(r['pct'] for r in runs):.2f} %")
        if args.profile:
            print(loc.profile(runs[-1]["job"], args.rate, args.seconds, args.profile))
    finally:
        loc.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
