"""The bench's stand (:class:`Harness`): brings up what every figure measures through (the
loopback test bed, a wheel index, the run's own hosts.yaml, state and daemon dirs, one open
Target) and holds the helpers the figures share; and the sizes a run takes."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.report import Figure, fmt, fmt_ratio, met_text
from gpujob.inventory.hosts import load_inventory
from gpujob.ops.target import Targets
from gpujob.ops.wheelhouse import build_indexes, serve
from testbed import TestBed

REPO = Path(__file__).resolve().parent.parent
HOME = "/root/.gpujob"          # gpujob's home in the container (Targets' default)
JOB_DIR = Path(__file__).resolve().parent / "job"
FINAL = ("succeeded", "failed", "stopped")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sizes:
    reps: int            # interleaved repetitions per figure (median taken)
    commands: int        # commands per repetition of the commands figure
    rate: float          # lines/s of the streaming job
    seconds: float       # how long the streaming job prints
    bulk_mb: int         # size of the bulk log
    status_reps: int


FULL = Sizes(reps=5, commands=50, rate=1000, seconds=60, bulk_mb=200, status_reps=7)
QUICK = Sizes(reps=1, commands=10, rate=1000, seconds=3, bulk_mb=8, status_reps=2)


class Harness:
    """One benchmark run's stand: the test bed (its own, or one handed in), the wheel
    index on loopback, a hosts.yaml and state dir of the run's own, one open Target;
    and the helpers the figures use to submit jobs and read them back."""

    def __init__(self, sizes: Sizes, *, bed: TestBed | None = None, log=None):
        self.sizes = sizes
        self.bed = bed
        self.own_bed = bed is None
        self.log = log or (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
        self.figures: dict[str, Figure] = {}
        self.job_ids: list[str] = []
        self.server = None
        self.targets = None

    # ---- setup -------------------------------------------------------------------
    def __enter__(self) -> "Harness":
        self.tmp = Path(tempfile.mkdtemp(prefix="gpujob-bench-"))
        try:
            if self.bed is None:
                self.log("starting the loopback test bed (4 sshd's, container 200)")
                self.bed = TestBed.start(n_sshd=4)
            if len(self.bed.ports) < 4:
                raise RuntimeError("the benchmark needs a test bed with 4 sshd's (TestBed.start(n_sshd=4))")
            idx = self.tmp / "wheelhouse"
            build_indexes(idx)
            self.server, base = serve(idx)
            self.urls = {b: f"{base}/{b}/simple" for b in ("fast", "slow")}
            self.hosts = self.bed.write_hosts_yaml(self.tmp / "hosts.yaml")
            self.env = dict(os.environ, GPUJOB_HOSTS=str(self.hosts),
                            XDG_STATE_HOME=str(self.tmp / "state"), COLUMNS="200")
            self.env.pop("GPUJOB_TESTBED", None)
            self.runtime = self.tmp / "run"  # the kept connection's daemon: this run's own
            self.runtime.mkdir(mode=0o700)
            self.targets = Targets(load_inventory(self.hosts))
            self.target = self.targets.open("tb/ct200")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if getattr(self, "runtime", None) is not None and self.runtime.exists():
            try:  # end the daemon this run started
                self.user_cli(["disconnect"], check=False)
            except Exception:  # noqa: BLE001 - leaving anyway
                pass
        if self.targets is not None:
            self.targets.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.own_bed and self.bed is not None:
            self.bed.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- helpers -----------------------------------------------------------------
    def cli(self, args: list[str], timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, "-m", "gpujob.cli.main", *args], env=self.env,
                           cwd=str(REPO), capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"gpujob {' '.join(args)} exited {p.returncode}: "
                               f"{p.stderr.decode(errors='replace')[-2000:]}")
        return p

    def ssh_pct(self, *argv: str, port: int | None = None) -> list[str]:
        return self.bed.ssh_argv("pct", "exec", str(self.bed.vmid), "--", *argv, port=port)

    def write_spec(self, name: str, *, profile: str, trainer: str) -> Path:
        spec = {
            "name": "bench",
            "target": "tb/ct200",
            "sync": [{"src": str(JOB_DIR), "dest": ".", "exclude": ["__pycache__", "checkpoint.json*"]}],
            "gpus": {"target": [0, 1], "drafter": [2, 3]},
            "profiles": [
                {"name": "fast", "index_url": self.urls["fast"],
                 "packages": ["gpujob-demo-kernels==1.0.0+fast"]},
                {"name": "slow", "index_url": self.urls["slow"],
                 "packages": ["gpujob-demo-kernels==1.0.0+slow"]},
            ],
            "profile": profile,
            "warmup": {"command": "python warmup.py", "per_gpu": "drafter", "timeout": "1m"},
            "train": {"command": f"python trainer.py {trainer}", "resume_args": ["--resume"], "grace": "3s"},
            "throughput": {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2,
                           "no_data_timeout": "30s", "good_after": "1s"},
        }
        path = self.tmp / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def submit(self, spec: Path, *extra: str) -> tuple[str, float]:
        """(job id, wall-clock time the `gpujob submit` process was started)."""
        t0 = time.time()
        # --force: the bench starts on the slow build on purpose, however often it was judged bad
        p = self.cli(["submit", str(spec), "--force", *extra])
        m = re.search(r"^submitted (\S+) ", p.stdout.decode(), re.M)
        if not m:
            raise RuntimeError(f"no job id in {p.stdout!r}")
        self.job_ids.append(m.group(1))
        return m.group(1), t0

    def cpath(self, path: str) -> Path:
        return self.bed.container_path(path)

    def jpath(self, job: str, name: str) -> Path:
        return self.cpath(f"{HOME}/jobs/{job}/{name}")

    def state(self, job: str) -> dict:
        try:
            return json.loads(self.jpath(job, "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def events(self, job: str) -> list[dict]:
        try:
            text = self.jpath(job, "events.jsonl").read_text()
        except OSError:
            return []
        return [json.loads(ln) for ln in text.splitlines() if ln.strip()]

    def wait_final(self, job: str, timeout: float = 300) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = self.state(job)
            if st.get("state") in FINAL:
                return st
            time.sleep(0.05)
        raise RuntimeError(f"job {job} did not end within {timeout:g}s: {self.state(job)}")

    def train_at(self, job: str) -> float:
        for e in self.events(job):
            if e["type"] == "phase" and e.get("phase") == "train":
                return e["t"]
        raise RuntimeError(f"job {job} never reached its train phase: {self.state(job)}")

    def succeeded(self, job: str, profile: str | None = None) -> dict:
        st = self.wait_final(job)
        if st.get("state") != "succeeded" or (profile and st.get("profile") != profile):
            raise RuntimeError(f"job {job} ended {st.get('state')} on {st.get('profile')}: "
                               f"{st.get('reason')}")
        return st

    def remove(self, pattern: str) -> list[str]:
        """rm -rf in the container (through the rootfs mount), glob allowed."""
        gone = []
        for p in glob.glob(str(self.cpath(pattern))):
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
            gone.append(p)
        return gone

    def proc(self, pid: int) -> dict:
        """CPU seconds (user+system, own only) and RSS of a process in the container."""
        r = self.bed.container_exec("cat", f"/proc/{pid}/stat", f"/proc/{pid}/status", timeout=30)
        text = r.stdout.decode()
        stat, _, status = text.partition("\n")
        rest = stat[stat.rfind(")") + 2:].split()
        kb = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(Vm\w+):\s+(\d+) kB", status, re.M)}
        # CPU in ns, the sum over its threads' schedstat: /proc/PID/stat counts in 10 ms ticks, and
        # a quick run's supervisor (under 1 % of a core for a few seconds) read 0 ticks there
        r = self.bed.container_exec("sh", "-c", 'cat /proc/"$1"/task/*/schedstat', "sh", str(int(pid)),
                                    timeout=30)
        ns = [int(ln.split()[0]) for ln in r.stdout.decode().splitlines() if ln.split()]
        cpu = sum(ns) / 1e9 if ns else (int(rest[11]) + int(rest[12])) / CLK_TCK
        return {"t": time.monotonic(), "cpu": cpu, "rss_kb": kb.get("VmRSS"), "hwm_kb": kb.get("VmHWM")}

    def add(self, fig: Figure) -> Figure:
        self.figures[fig.key] = fig
        self.log(f"{fig.key}: ours {fmt(fig.ours, fig.unit)}, baseline {fmt(fig.baseline, fig.unit)}, "
                 f"ratio {fmt_ratio(fig.ratio)}, target {fig.target}: {met_text(fig.met)}")
        return fig

    def failed(self, keys: tuple, names: dict, e: BaseException) -> None:
        msg = f"{type(e).__name__}: {e}"
        self.log(f"{'/'.join(keys)} FAILED: {msg}\n{traceback.format_exc()}")
        for k in keys:
            if k not in self.figures:
                self.figures[k] = Figure(k, names.get(k, k), "", "", error=msg)

    def script(self) -> list[str]:
        """The installed console script (what users run: it takes the kept connection)."""
        exe = Path(sys.executable).parent / "gpujob"
        return [str(exe)] if exe.exists() else [sys.executable, "-c",
                                                 "import sys; from gpujob.entry import main; "
                                                 "sys.exit(main())"]

    def user_cli(self, args: list[str], *, daemon: bool = True, check: bool = True,
                 env: dict | None = None, stdout: list | None = None) -> float:
        """Seconds one ``gpujob ARGS`` took as users run it: the console script, the kept
        connection on (its daemon under this run's private XDG_RUNTIME_DIR), or off;
        ``env``: variables set on top (another inventory or job index); ``stdout`` gets
        what it printed appended."""
        env = dict(self.env, XDG_RUNTIME_DIR=str(self.runtime), **(env or {}))
        env.pop("GPUJOB_NO_DAEMON", None)
        if not daemon:
            env["GPUJOB_NO_DAEMON"] = "1"
        t0 = time.perf_counter()
        p = subprocess.run(self.script() + args, env=env, cwd=str(REPO), capture_output=True, timeout=300)
        took = time.perf_counter() - t0
        if check and p.returncode != 0:
            raise RuntimeError(f"gpujob {' '.join(args)} exited {p.returncode}: "
                               f"{p.stderr.decode(errors='replace')[-2000:]}")
        if stdout is not None:
            stdout.append(p.stdout)
        return took
