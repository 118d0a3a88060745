"""Where the supervisor's CPU goes at 1,000 lines/s, on this machine (no test bed).

``python -m bench.supervisor_cpu`` submits the benchmark's streaming job (bench/job's
trainer: 1,000 time-stamped lines/s, every 10th a tok/s line) to a private ``local``
target and reads the supervisor's own CPU time (its threads' schedstat, in ns) over
the train phase, as ``python -m bench`` does in the container. With ``--profile`` it
then runs one more supervisor of the same job in the foreground under cProfile with a
CPU-time clock (``time.process_time``: kernel time inside a call counts for it, a sleep
does not) and prints the functions that cost most.

    python -m bench.supervisor_cpu --seconds 20 --reps 3
    python -m bench.supervisor_cpu --seconds 10 --profile 25
    python -m bench.supervisor_cpu --reps 5 --against /tmp/old-tree --pyspy /tmp/spy
    python -m bench.supervisor_cpu --rate 70 --tps-every 1 --judging defaults --seconds 60 \\
        --against /tmp/old-tree
    python -m bench.supervisor_cpu --rate 70 --tps-every 1 --judging nanogpt --eval-every 5 \\
        --seconds 250 --age 60 --against /tmp/old-tree

``--age SPAN`` reads the supervisor's CPU over the train phase's first SPAN seconds and its
last SPAN seconds and prints their ratio (issue 38: flat over a run's age); ``--eval-every S``
has the trainer print an eval line every S seconds, each a pause (``pause_pattern``, a 1 s
``pause_tail``), as a trainer that evaluates or saves every few seconds.

``--against TREE`` alternates run by run between this tree and another checkout of gpujob
(its CLI submits, so its agent runs): the two figures come from the same minutes. ``--pyspy
PREFIX`` records each measured supervisor with py-spy (``PREFIX-<tree>-<rep>.txt``,
collapsed stacks of the samples in which it runs) over the same window, without stopping it
(``--nonblocking``: a stop at each sample would break its waits and its figure; a stack read
while it runs may mix two moments, so read the shares ±2 points).
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

from gpujob.ops.wheelhouse import build_indexes, serve  # noqa: E402

JOB_DIR = REPO / "bench" / "job"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """CPU seconds so far: the sum of its threads' schedstat (ns), as bench/harness.py reads the
    container's supervisor; /proc/PID/stat's 10 ms ticks left a 20 s run's figure +-5 %."""
    ns = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns += int(f.read().split()[0])
        return ns / 1e9
    except (OSError, ValueError, IndexError):  # no schedstat (a kernel without it): the ticks
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        rest = stat[stat.rfind(")") + 2:].split()
        return (int(rest[11]) + int(rest[12])) / CLK_TCK


def switches_of(pid: int) -> int:
    """The process's voluntary context switches so far: its waits that slept, so its
    wakeups (the preemptions, which grow with the machine's load, are not counted)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[-1])
    return 0


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

    tps_every = 10  # every Nth line a tok/s sample (1: every line, nanoGPT's iter lines at --rate 70)
    judging = "counts"  # "counts": window 3, failure_limit 2; "defaults": the tree's own defaults
    eval_every = None  # seconds between the trainer's eval lines, each a pause (pause_pattern, pause_tail 1s)

    def spec(self, rate: float, seconds: float, repo: Path = REPO) -> Path:
        spec = {
            "name": "bench", "target": "lab/box",
            # this tree's trainer for either tree's supervisor: the same lines to both
            "sync": [{"src": str(JOB_DIR), "dest": ".", "exclude": ["__pycache__", "checkpoint.json*"]}],
            "gpus": {"target": [0, 1], "drafter": [2, 3]},
            "profiles": [{"name": "fast", "index_url": self.urls["fast"],
                          "packages": ["gpujob-demo-kernels==1.0.0+fast"]}],
            "profile": "fast",
            "train": {"command": f"python trainer.py --rate {rate:g} --seconds {seconds:g} "
                                 f"--tps-every {self.tps_every}" +
                                 (f" --eval-every {self.eval_every:g}" if self.eval_every else ""),
                      "resume_args": ["--resume"], "grace": "3s"},
            "throughput": {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2,
                           "no_data_timeout": "30s", "good_after": "1s"},
        }
        if self.judging == "defaults":  # what `gpujob init` leaves: the judging times are gpujob's
            for k in ("window", "failure_limit", "good_after"):
                del spec["throughput"][k]
        elif self.judging == "nanogpt":  # the H200 nanoGPT runs' (../shared/traces/specs/nanogpt.yaml)
            spec["throughput"].update(window="10s", failure_limit="10s", good_after="20s")
        if self.eval_every:  # a pause every few seconds (an eval, then its 1 s tail)
            spec["throughput"].update(pause_pattern=r"^\S+ eval:", pause_tail="1s")
        path = self.tmp / "stream.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def submit(self, spec: Path, repo: Path = REPO) -> str:
        p = subprocess.run([sys.executable, "-m", "gpujob.cli.main", "submit", str(spec), "--force"],
                           env=dict(self.env, PYTHONPATH=str(repo)), capture_output=True, cwd=str(repo),
                           timeout=300)
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

    def measure(self, rate: float, seconds: float, repo: Path = REPO, spy: str | None = None,
                age: float | None = None) -> dict:
        job = self.submit(self.spec(rate, seconds, repo), repo)
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
        if age:
            return self.measure_age(job, pid, t_train, seconds, age)
        time.sleep(min(1.0, seconds / 4))
        a = (time.monotonic(), cpu_of(pid), switches_of(pid))
        span = max(0.5, t_train + seconds - 0.5 - time.monotonic())
        recorder = None
        if spy:  # the same window, sampled (py-spy's own CPU is not the supervisor's)
            recorder = subprocess.Popen([pyspy(), "record", "--pid", str(pid), "--nonblocking", "--rate",
                                         "1000", "--format", "raw", "--duration", str(max(1, int(span))),
                                         "--output", spy], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        time.sleep(span)
        b = (time.monotonic(), cpu_of(pid), switches_of(pid))
        if recorder is not None:
            recorder.wait(timeout=60)
        end = time.monotonic() + 60
        while time.monotonic() < end and self.state(job).get("state") not in ("succeeded", "failed",
                                                                              "stopped"):
            time.sleep(0.1)
        st = self.state(job)
        if st.get("state") != "succeeded":
            raise RuntimeError(f"job {job} ended {st.get('state')}: {st.get('reason')}")
        return {"job": job, "cpu_s": b[1] - a[1], "window_s": b[0] - a[0],
                "pct": (b[1] - a[1]) / (b[0] - a[0]) * 100, "wakeups_s": (b[2] - a[2]) / (b[0] - a[0])}

    def measure_age(self, job: str, pid: int, t_train: float, seconds: float, span: float) -> dict:
        """The supervisor's CPU over the train phase's first ``span`` seconds (from 5 s in) and
        its last (up to 5 s before its end): whether its cost grows with the run's age."""
        marks = {}
        for name, at in (("first_a", 5.0), ("first_b", 5.0 + span), ("last_a", seconds - 5.0 - span),
                         ("last_b", seconds - 5.0)):
            time.sleep(max(0.0, t_train + at - time.monotonic()))
            marks[name] = (time.monotonic(), cpu_of(pid))
        self.wait_end(job)
        def pct(a, b):
            return (marks[b][1] - marks[a][1]) / (marks[b][0] - marks[a][0]) * 100
        first, last = pct("first_a", "first_b"), pct("last_a", "last_b")
        return {"job": job, "first_pct": first, "last_pct": last, "ratio": last / first if first else None,
                "pauses": self.pauses(job)}

    def pauses(self, job: str) -> int:
        path = self.job_dir(job) / "events.jsonl"
        return sum('"type": "pause"' in ln for ln in path.read_text().splitlines())

    def wait_end(self, job: str) -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and \
                self.state(job).get("state") not in ("succeeded", "failed", "stopped"):
            time.sleep(0.1)
        st = self.state(job)
        if st.get("state") != "succeeded":
            raise RuntimeError(f"job {job} ended {st.get('state')}: {st.get('reason')}")

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
        (dst / "state.json").write_text(json.dumps({"job_id": new, "name": jobj["spec"]["name"],
                                                    "state": "preparing",
                                                    "phase": "start", "step": "env",
                                                    "profile": jobj["profile"],
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


def pyspy() -> str:
    """py-spy beside this interpreter (the venv's), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else (shutil.which("py-spy") or "py-spy")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.supervisor_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--tps-every", type=int, default=10,
                    help="every Nth line a sample (1 with --rate 70: nanoGPT)")
    ap.add_argument("--judging", choices=("counts", "defaults", "nanogpt"), default="counts",
                    help="the spec's judging times: a count window, each tree's own defaults, or the H200 "
                         "nanoGPT runs' (10s window, 10s failure_limit)")
    ap.add_argument("--profile", type=int, metavar="TOP", help="then profile one supervisor; show TOP rows")
    ap.add_argument("--against", type=Path, metavar="TREE", help="alternate with this other checkout's code")
    ap.add_argument("--pyspy", metavar="PREFIX", help="record each measured supervisor with py-spy")
    ap.add_argument("--eval-every", type=float, metavar="S",
                    help="an eval line every S seconds, each a pause")
    ap.add_argument("--age", type=float, metavar="SPAN",
                    help="CPU over the run's first SPAN seconds and its last, and their ratio "
                         "(--seconds >= 2 SPAN + 10)")
    args = ap.parse_args(argv)
    trees = [("this", REPO)] + ([("other", args.against.resolve())] if args.against else [])
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-supcpu-"))
    loc = Local(tmp)
    loc.tps_every, loc.judging, loc.eval_every = args.tps_every, args.judging, args.eval_every
    try:
        runs: list = []
        by: dict = {name: [] for name, _ in trees}
        for rep in range(args.reps):
            for name, repo in trees if rep % 2 == 0 else trees[::-1]:  # ABBA: neither always first
                spy = f"{args.pyspy}-{name}-{rep}.txt" if args.pyspy else None
                r = loc.measure(args.rate, args.seconds, repo, spy, args.age)
                runs.append(r)
                if args.age:
                    by[name].append(r["ratio"])
                    who = name if args.against else "supervisor"
                    print(f"{who} CPU first {args.age:g} s {r['first_pct']:.2f} %, "
                          f"last {args.age:g} s {r['last_pct']:.2f} % of a core: last/first {r['ratio']:.2f} "
                          f"({r['pauses']} pauses), load {os.getloadavg()[0]:.2f}", flush=True)
                    continue
                by[name].append(r["pct"])
                print(f"{name if args.against else 'supervisor'} CPU {r['pct']:.2f} % of a core "
                      f"({r['cpu_s']:.3f} CPU-s in {r['window_s']:.1f} s, {r['wakeups_s']:.0f} wakeups/s), "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
        for name, got in by.items():
            if len(got) > 1:
                unit = "" if args.age else " %"  # (--age: the last/first ratios)
                print(f"{name if args.against else ''} median {statistics.median(got):.2f}{unit} "
                      f"({min(got):.2f}-{max(got):.2f})".strip())
        if args.profile:
            print(loc.profile(runs[-1]["job"], args.rate, args.seconds, args.profile))
    finally:
        loc.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
