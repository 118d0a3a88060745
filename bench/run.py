"""The benchmark: brings up the loopback test bed and measures every figure of
BENCHMARKS.md against its baseline, in the same run, interleaved.

Each figure is measured through the real stack: paramiko (ours) or the OpenSSH
client (baselines) → the test bed's sshd on 127.0.0.1 → the fake ``pct`` →
``lxc-attach`` into a real Debian LXC container, where gpujob's agent and
supervisor run and uv (shipped by gpujob) builds venvs from a wheel index
served over loopback HTTP.

Figures (``ours`` / ``baseline``, repetitions interleaved, medians):

commands     N × ``Target.run(["true"])`` over one ``Targets`` connection /
             N × a new ``ssh … pct exec 200 -- true``; milliseconds per command
exec_cli     one whole ``gpujob exec tb/ct200 -- true`` process as users run it (the installed
             console script, the kept connection on: warm, and cold after ``gpujob
             disconnect``; and with GPUJOB_NO_DAEMON=1) / one ``ssh … pct exec``;
             ``gpujob --version`` and ``--help`` start-up beside them
latency      a job whose trainer prints time-stamped lines at 1000 lines/s;
             ``jobs.follow_log`` (what ``gpujob logs -f`` runs) streams them;
             latency = receive time − the time stamp in the line (one clock)
bulk         a 200 MB file in the job dir: ``follow_log(follow=False)`` /
             ``ssh … pct exec 200 -- cat FILE > /dev/null``; MB/s
rollback     ``rollback_done.took`` (decision → trainer running on the known-good
             profile) with its venv prebuilt / with the venv deleted first (so
             the supervisor reinstalls it from the loopback index; uv cache kept)
resubmit     ``gpujob submit`` start → the supervisor's ``phase: train`` event:
             an unchanged resubmit / a first submit (agent, uv, code, venv, uv
             cache and compile cache all absent)
supervisor   CPU time and peak RSS of the supervisor process during the 1000
             lines/s job, from /proc/PID/stat and /proc/PID/status in the container
status4      ``gpujob ps`` (its code, in this process: fresh connections each run)
             over jobs on 4 hosts (the bed's 4 sshd's) / the same code with
             ``PS_WORKERS`` cut to 1 (hosts one after another)
ps4_kept     the same over kept connections (one Targets, opened before timing) /
             one after another; ps50: over 50 inventory entries on the one loopback
             sshd / over 1 of them (bench/psfan.py)
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from gpujob import jobs  # noqa: E402
from gpujob.inventory import load_inventory  # noqa: E402
from gpujob.target import Targets  # noqa: E402
from gpujob.wheelhouse import build_indexes, serve  # noqa: E402
from tests.testbed import TestBed  # noqa: E402

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

ORDER = ("commands", "exec_cli", "exec_cli_cold", "exec_cli_nodaemon", "startup_version", "startup_help",
         "latency_p50", "latency_p99", "bulk", "rollback", "rollback_uvcache",
         "resubmit",
         "supervisor_cpu", "supervisor_rss", "status4", "ps4_kept", "ps50")


@dataclass
class Figure:
    key: str
    figure: str
    unit: str
    target: str
    ours: float | None = None
    baseline: float | None = None
    ratio: float | None = None      # >1 is better for us: baseline/ours for times, ours/baseline for rates
    met: bool | None = None         # None: no target
    samples: dict = field(default_factory=dict)
    note: str = ""
    error: str | None = None


def median(xs):
    return statistics.median(xs) if xs else None


def percentile(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def cpu_busy() -> float:
    """CPU seconds this machine has spent busy (all cores, /proc/stat) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


class Bench:
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
    def __enter__(self) -> "Bench":
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
                {"name": "fast", "index_url": self.urls["fast"], "packages": ["gpujob-demo-kernels==1.0.0+fast"]},
                {"name": "slow", "index_url": self.urls["slow"], "packages": ["gpujob-demo-kernels==1.0.0+slow"]},
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
            raise RuntimeError(f"job {job} ended {st.get('state')} on {st.get('profile')}: {st.get('reason')}")
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
        return {"t": time.monotonic(), "cpu": (int(rest[11]) + int(rest[12])) / CLK_TCK,
                "rss_kb": kb.get("VmRSS"), "hwm_kb": kb.get("VmHWM")}

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

    # ---- figures -----------------------------------------------------------------
    def fig_commands(self) -> None:
        n, t = self.sizes.commands, self.target
        if not t.run(["true"]).ok:  # the one connection is open (and its first channel done)
            raise RuntimeError("`true` failed in the container")
        base_argv = self.ssh_pct("true")
        ours, base = [], []
        for _ in range(self.sizes.reps):
            t0 = time.perf_counter()
            for _ in range(n):
                r = t.run(["true"])
                if not r.ok:
                    raise RuntimeError(f"true failed: {r.tail()}")
            ours.append((time.perf_counter() - t0) / n * 1000)
            t0 = time.perf_counter()
            for _ in range(n):
                subprocess.run(base_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
            base.append((time.perf_counter() - t0) / n * 1000)
        o, b = median(ours), median(base)
        self.add(Figure("commands", f"{n} container commands (per command)", "ms",
                        "≥ 10× faster and ≤ 33 ms", o, b, b / o, b / o >= 10 and o <= 33,
                        {"ours_ms": ours, "baseline_ms": base, "breakdown_ms": self.command_breakdown()},
                        "ours: Target.run(['true']) over one SSH connection (a channel + pct exec each); "
                        "baseline: a new `ssh … pct exec 200 -- true` each"))

    def command_breakdown(self, n: int = 10) -> dict:
        """Where one container command's time goes (ms each, median of n): the pieces of
        `pct exec` over an open connection, each run on its own."""
        def ms(fn) -> float:
            xs = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                xs.append((time.perf_counter() - t0) * 1000)
            return round(median(xs), 2)

        host = self.target.host_transport
        clean = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.path.expanduser("~root")}
        run = lambda argv, env=None: subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,  # noqa: E731
                                                    stdout=subprocess.DEVNULL, check=True)
        return {
            # a channel on the open connection running `true` on the host: sshd's session
            # plus the login shell (bash -c, which reads ~/.bashrc when SSH_CLIENT is set)
            "ssh_channel_true_on_host": ms(lambda: host.run(["true"])),
            "bash_c_true_as_sshd_runs_it": ms(lambda: run(["bash", "-c", "true"],
                                                          dict(clean, SSH_CLIENT="127.0.0.1 1 22"))),
            "bash_c_true_without_ssh_client": ms(lambda: run(["bash", "-c", "true"], clean)),
            "pct_exec_true_on_host_no_ssh": ms(lambda: run([str(self.bed.bin_dir / "pct"), "exec",
                                                            str(self.bed.vmid), "--", "true"])),
            "lxc_attach_true": ms(lambda: self.bed.container_exec("true")),
        }

    def script(self) -> list[str]:
        """The installed console script (what users run: it takes the kept connection)."""
        exe = Path(sys.executable).parent / "gpujob"
        return [str(exe)] if exe.exists() else [sys.executable, "-c",
                                                 "import sys; from gpujob.conn.entry import main; sys.exit(main())"]

    def user_cli(self, args: list[str], *, daemon: bool = True, check: bool = True) -> float:
        """Seconds one ``gpujob ARGS`` took as users run it: the console script, the kept
        connection on (its daemon under this run's private XDG_RUNTIME_DIR), or off."""
        env = dict(self.env, XDG_RUNTIME_DIR=str(self.runtime))
        env.pop("GPUJOB_NO_DAEMON", None)
        if not daemon:
            env["GPUJOB_NO_DAEMON"] = "1"
        t0 = time.perf_counter()
        p = subprocess.run(self.script() + args, env=env, cwd=str(REPO), capture_output=True, timeout=300)
        took = time.perf_counter() - t0
        if check and p.returncode != 0:
            raise RuntimeError(f"gpujob {' '.join(args)} exited {p.returncode}: "
                               f"{p.stderr.decode(errors='replace')[-2000:]}")
        return took

    def fig_exec_cli(self) -> None:
        """``gpujob exec`` in the default configuration (console script, kept connection,
        warm and cold) and without the daemon, each against one ``ssh … pct exec``; and
        the CLI's start-up (``--version``, ``--help``)."""
        argv = ["exec", "tb/ct200", "--", "true"]
        runs: dict = {"warm": [], "cold": [], "no_daemon": [], "ssh": [], "version": [], "help": []}
        self.user_cli(argv)  # the daemon is up and its connection open
        for _ in range(self.sizes.reps):
            runs["warm"].append(self.user_cli(argv))
            t0 = time.perf_counter()
            subprocess.run(self.ssh_pct("true"), stdin=subprocess.DEVNULL, check=True)
            runs["ssh"].append(time.perf_counter() - t0)
            self.user_cli(["disconnect"], check=False)
            runs["cold"].append(self.user_cli(argv))
            runs["no_daemon"].append(self.user_cli(argv, daemon=False))
            runs["version"].append(self.user_cli(["--version"]))
            runs["help"].append(self.user_cli(["--help"]))
        m = {k: median(v) for k, v in runs.items()}
        b = m["ssh"]
        common = {f"{k}_s": v for k, v in runs.items()}
        for key, what, mode, target, ok in (
                ("exec_cli", "warm, kept connection (default)", "warm", "≥ 2× faster", lambda r: r >= 2),
                ("exec_cli_cold", "cold: first call, daemon started", "cold", "within 1.5× (≥ 0.67×)",
                 lambda r: r >= 1 / 1.5),
                ("exec_cli_nodaemon", "GPUJOB_NO_DAEMON=1", "no_daemon", "—", None)):
            r = b / m[mode]
            self.add(Figure(key, f"one `gpujob exec tb/ct200 -- true`, {what}", "ms", target,
                            m[mode] * 1000, b * 1000, r, ok(r) if ok else None, common,
                            "the installed console script as a fresh process, against one "
                            "`ssh … pct exec 200 -- true`"))
        self.add(Figure("startup_version", "`gpujob --version` (console script)", "ms", "≤ 150 ms",
                        m["version"] * 1000, None, None, m["version"] <= 0.150, common))
        self.add(Figure("startup_help", "`gpujob --help` (console script)", "ms", "≤ 400 ms",
                        m["help"] * 1000, None, None, m["help"] <= 0.400, common))

    def fig_resubmit(self) -> None:
        spec = self.write_spec("resubmit.yaml", profile="fast", trainer="--lines 40 --rate 25")
        first, again = [], []
        for _ in range(self.sizes.reps):
            # a first submit: nothing of gpujob's in the container but the job ledger
            for p in (f"{HOME}/bin", f"{HOME}/envs/fast-*", f"{HOME}/caches/fast-*", f"{HOME}/uv-cache",
                      f"{HOME}/work/bench"):
                self.remove(p)
            job, t0 = self.submit(spec)
            self.succeeded(job, "fast")
            first.append(self.train_at(job) - t0)
            job, t0 = self.submit(spec)
            self.succeeded(job, "fast")
            ev = self.events(job)
            if any(e["type"] == "env_build" for e in ev) or not any(e["type"] == "warmup_skipped" for e in ev):
                raise RuntimeError(f"resubmit {job} rebuilt its venv or ran its warmup")
            again.append(self.train_at(job) - t0)
        o, b = median(again), median(first)
        self.add(Figure("resubmit", "resubmit, unchanged profile: submit → train", "s", "≤ 3 s",
                        o, b, b / o, o <= 3, {"resubmit_s": again, "first_submit_s": first},
                        "from the start of the `gpujob submit` process to the supervisor's "
                        "`phase: train` event; first submit = agent, uv, code, venv, uv cache and "
                        "compile cache all absent (uv shipped, venv built, warmup run)"))

    def fig_stream(self) -> str:
        """The 1000 lines/s job: write→print latency and the supervisor's overhead."""
        rate, secs = self.sizes.rate, self.sizes.seconds
        spec = self.write_spec("stream.yaml", profile="fast",
                               trainer=f"--rate {rate:g} --seconds {secs:g} --tps-every 10")
        job, _ = self.submit(spec)
        started = time.time()
        lat: list[float] = []
        buf = bytearray()
        count = [0]

        def write(chunk: bytes) -> None:
            now = time.time()
            buf.extend(chunk)
            *lines, rest = bytes(buf).split(b"\n")
            buf[:] = rest
            for ln in lines:
                try:
                    ts = float(ln[:ln.index(b" ")])
                except ValueError:
                    continue  # gpujob's banner lines, warmup output
                count[0] += 1
                if ts >= started + 1.0:  # steady state: not what was printed before we followed
                    lat.append(now - ts)

        samples: list[dict] = []
        err: list[BaseException] = []

        def sample() -> None:
            try:
                end = time.monotonic() + 120
                while time.monotonic() < end:
                    st = self.state(job)
                    if st.get("phase") == "train" and st.get("child_pid"):
                        break
                    if st.get("state") in FINAL:
                        raise RuntimeError(f"job {job} ended before training: {st.get('reason')}")
                    time.sleep(0.05)
                t_train = time.monotonic()
                pid = self.state(job)["supervisor_pid"]
                time.sleep(min(1.0, secs / 4))
                samples.append(self.proc(pid))
                time.sleep(max(0.5, t_train + secs - 0.5 - time.monotonic()))
                samples.append(self.proc(pid))
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                err.append(e)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        jobs.follow_log(self.target, job, write=write, notice=lambda m: self.log(f"follow: {m}"))
        th.join(30)
        self.succeeded(job, "fast")
        if err:
            raise err[0]
        if len(samples) != 2 or not lat:
            raise RuntimeError(f"no measurement (samples {len(samples)}, {len(lat)} latencies)")
        a, b = samples
        cpu = (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]) * 100
        rss = max(b["hwm_kb"] or 0, b["rss_kb"] or 0) / 1024
        lat_ms = [x * 1000 for x in lat]
        p50, p99 = percentile(lat_ms, 50), percentile(lat_ms, 99)
        common = {"lines_measured": len(lat_ms), "lines_seen": count[0], "rate": rate, "seconds": secs,
                  "p90_ms": percentile(lat_ms, 90), "max_ms": max(lat_ms)}
        note = (f"trainer prints {rate:g} time-stamped lines/s (every 10th a `step N | … | 12.8K tok/s` "
                f"line) for {secs:g} s; jobs.follow_log streams job.log over the one SSH connection")
        self.add(Figure("latency_p50", f"`logs -f` write→print latency p50 @ {rate:g} lines/s", "ms",
                        "≤ 100 ms", p50, None, None, p50 <= 100, common, note))
        self.add(Figure("latency_p99", f"`logs -f` write→print latency p99 @ {rate:g} lines/s", "ms",
                        "≤ 300 ms", p99, None, None, p99 <= 300, common, note))
        self.add(Figure("supervisor_cpu", f"supervisor CPU @ {rate:g} lines/s for {secs:g} s",
                        "% core", "≤ 2 % of a core", cpu, None, None, cpu <= 2,
                        {"window_s": b["t"] - a["t"], "cpu_s": b["cpu"] - a["cpu"]},
                        "utime+stime of the supervisor (not its children) over the train phase, "
                        "from /proc/PID/stat in the container"))
        self.add(Figure("supervisor_rss", "supervisor peak RSS (VmHWM)", "MB", "≤ 40 MB", rss, None,
                        None, rss <= 40, {"vmrss_mb": (b["rss_kb"] or 0) / 1024,
                                          "vmhwm_mb": (b["hwm_kb"] or 0) / 1024}))
        return job

    def fig_bulk(self, job: str) -> None:
        size = self.sizes.bulk_mb * 1_000_000
        path = self.jpath(job, "bulk.log")
        line = b"1732890000.123456 step 123456 | loss 1.2345 | 12.8K tok/s | lr 3.0e-4 grad-norm 0.98\n"
        with open(path, "wb") as f:
            block = line * (1_000_000 // len(line))
            while f.tell() + len(block) <= size:
                f.write(block)
            f.write(line * ((size - f.tell()) // len(line)))
        size = path.stat().st_size
        base_argv = self.ssh_pct("cat", f"{HOME}/jobs/{job}/bulk.log")
        ours, base = [], []
        for _ in range(self.sizes.reps):
            got = [0]

            def count(chunk: bytes) -> None:
                got[0] += len(chunk)

            t0 = time.perf_counter()
            jobs.follow_log(self.target, job, file="bulk.log", follow=False, write=count,
                            notice=lambda m: None)
            ours.append(size / (time.perf_counter() - t0) / 1e6)
            if got[0] != size:
                raise RuntimeError(f"follow_log delivered {got[0]} of {size} bytes")
            t0 = time.perf_counter()
            subprocess.run(base_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
            base.append(size / (time.perf_counter() - t0) / 1e6)
        path.unlink()
        o, b = median(ours), median(base)
        self.add(Figure("bulk", f"`logs -f` bulk: a {size / 1e6:.0f} MB log", "MB/s", "≥ 0.8× its throughput",
                        o, b, o / b, o / b >= 0.8, {"ours_mb_s": ours, "baseline_mb_s": base},
                        "ours: jobs.follow_log(follow=False) (agent `tail` → pct exec → paramiko); "
                        "baseline: `ssh … pct exec 200 -- cat FILE > /dev/null`"))

    def fig_rollback(self) -> None:
        spec = self.write_spec("rollback.yaml", profile="slow", trainer="--lines 40 --rate 40")
        modes = {"prebuilt": [], "reinstall_from_index": [], "reinstall_from_uv_cache": []}
        steps = []  # each prebuilt switch: (ms after the decision, event) up to rollback_done
        for _ in range(self.sizes.reps):
            for mode, out in modes.items():
                if mode != "prebuilt" and not self.remove(f"{HOME}/envs/fast-*"):
                    raise RuntimeError("no fast venv to delete")
                if mode == "reinstall_from_index":
                    self.remove(f"{HOME}/uv-cache")
                job, _ = self.submit(spec)
                st = self.succeeded(job, "fast")
                ev = self.events(job)
                done = [e for e in ev if e["type"] == "rollback_done"]
                if not done or done[-1]["from"] != "slow" or done[-1]["signal"] != "low_throughput":
                    raise RuntimeError(f"job {job}: no slow → fast rollback ({st.get('rollbacks')})")
                built = any(e["type"] == "env_build" and e.get("profile") == "fast" for e in ev)
                if built != (mode != "prebuilt"):
                    raise RuntimeError(f"job {job} ({mode}): fast venv built = {built}")
                out.append(done[-1]["took"])
                if mode == "prebuilt":
                    t0 = done[-1]["decided_at"]
                    steps.append((done[-1]["took"], [(round((e["t"] - t0) * 1000, 1), e["type"]) for e in ev
                                                     if t0 - 0.001 <= e["t"] <= t0 + done[-1]["took"] + 0.05]))
        o = median(modes["prebuilt"])
        for key, mode, what in (("rollback", "reinstall_from_index", "venv and uv cache deleted: uv "
                                 "downloads the wheel from the loopback index again"),
                                ("rollback_uvcache", "reinstall_from_uv_cache", "venv deleted, uv cache "
                                 "kept: uv installs from its cache")):
            b = median(modes[mode])
            self.add(Figure(key, "rollback: decision → trainer running on known-good"
                            + (" (baseline from uv cache)" if key == "rollback_uvcache" else ""), "s",
                            "≤ 2 s and ≥ 20× faster", o, b, b / o, o <= 2 and b / o >= 20,
                            {"prebuilt_s": modes["prebuilt"], f"{mode}_s": modes[mode],
                             "prebuilt_steps_ms": sorted(steps)[len(steps) // 2][1] if steps else []},
                            "the supervisor's rollback_done.took (decision → trainer spawned on the "
                            "known-good profile, its venv prebuilt); baseline: the same with the venv "
                            f"reinstalled first ({what}; uv venv + uv pip install + verify)"))

    def fig_status4(self) -> None:
        import gpujob.cli.jobs_cmds as cm  # ps, and the out and PS_WORKERS it uses
        from rich.console import Console

        from gpujob.state import State
        done = [j for j in self.job_ids if self.state(j).get("state") in FINAL]
        if len(done) < 4:  # run on its own (--only status4): make a few short jobs to ask about
            spec = self.write_spec("short.yaml", profile="fast", trainer="--lines 5 --rate 50")
            for _ in range(4 - len(done)):
                job, _ = self.submit(spec)
                self.wait_final(job)
                done.append(job)
        state_home = self.tmp / "state-ps"
        db = State(state_home / "gpujob" / "state.db")
        hosts = self.bed.host_names[:4]
        for job, host in zip(done[-4:], hosts):
            db.reserve(job, "bench", f"{host}/ct{self.bed.vmid}", "", "", "fast")
        db.close()
        saved = {k: os.environ.get(k) for k in ("GPUJOB_HOSTS", "XDG_STATE_HOME")}
        os.environ.update(GPUJOB_HOSTS=str(self.hosts), XDG_STATE_HOME=str(state_home))
        real_out, real_workers = cm.out, cm.PS_WORKERS

        def ps(parallel: bool) -> float:
            cm.ctx.hosts, cm.ctx._targets, cm.ctx._state = None, None, None
            sink = io.StringIO()
            cm.out = Console(file=sink, width=200, highlight=False)
            cm.PS_WORKERS = real_workers if parallel else 1
            try:
                busy0, c0, t0 = cpu_busy(), time.process_time(), time.perf_counter()
                cm.ps(target=None, all_=False, as_json=True, limit=20, timeout=cm.PS_TIMEOUT)
                took = time.perf_counter() - t0
                use["parallel" if parallel else "sequential"].append(
                    {"client_cpu_s": time.process_time() - c0, "machine_cpu_s": cpu_busy() - busy0,
                     "machine_busy": (cpu_busy() - busy0) / (took * (os.cpu_count() or 1))})
            finally:
                cm.ctx.close()
                cm.ctx._targets, cm.ctx._state = None, None
                cm.out, cm.PS_WORKERS = real_out, real_workers
            views = json.loads(sink.getvalue())
            seen = {v["target"] for v in views if v["state"] in FINAL}
            if len(seen) != 4:
                raise RuntimeError(f"gpujob ps did not reach 4 hosts: {views}")
            return took

        ours, base = [], []
        use: dict = {"parallel": [], "sequential": []}
        try:
            for _ in range(self.sizes.status_reps):
                ours.append(ps(True))
                base.append(ps(False))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        o, b = median(ours), median(base)
        self.add(Figure("status4", "`gpujob ps` over 4 hosts (4 sshd's)", "s", "≥ 3× faster",
                        o, b, b / o, b / o >= 3,
                        {"parallel_s": ours, "sequential_s": base,
                         "cpu": {k: {m: round(median([u[m] for u in v]), 3) for m in v[0]}
                                 for k, v in use.items()}},
                        "the ps command's code in-process, new SSH connections each run (as a fresh CLI); "
                        "baseline: the same code with its thread pool cut to one worker"))

    def fig_ps_kept(self) -> None:
        from bench import psfan
        psfan.run(self, Figure, median, FINAL)

    # ---- the run -----------------------------------------------------------------
    def run(self, only: set | None = None) -> list[Figure]:
        names = {"commands": "container commands", "exec_cli": "gpujob exec (whole CLI)",
                 "exec_cli_cold": "gpujob exec, cold", "exec_cli_nodaemon": "gpujob exec, no daemon",
                 "startup_version": "gpujob --version", "startup_help": "gpujob --help",
                 "latency_p50": "logs -f latency p50", "latency_p99": "logs -f latency p99",
                 "bulk": "logs -f bulk", "rollback": "rollback", "rollback_uvcache": "rollback (uv cache)",
                 "resubmit": "resubmit",
                 "supervisor_cpu": "supervisor CPU", "supervisor_rss": "supervisor RSS",
                 "status4": "gpujob ps over 4 hosts", "ps4_kept": "gpujob ps over 4 hosts, kept",
                 "ps50": "gpujob ps over 50 hosts"}
        want = lambda *keys: only is None or any(k in only for k in keys)  # noqa: E731
        steps = [(("commands",), self.fig_commands),
                 (("exec_cli", "exec_cli_cold", "exec_cli_nodaemon", "startup_version", "startup_help"),
                  self.fig_exec_cli),
                 (("resubmit",), self.fig_resubmit)]
        for keys, fn in steps:
            if want(*keys):
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - one figure failing does not stop the run
                    self.failed(keys, names, e)
        stream_job = None
        keys = ("latency_p50", "latency_p99", "supervisor_cpu", "supervisor_rss")
        if want(*keys, "bulk", "rollback"):
            try:
                stream_job = self.fig_stream()
            except Exception as e:  # noqa: BLE001
                self.failed(keys, names, e)
        if want("bulk"):
            try:
                if stream_job is None:
                    raise RuntimeError("the streaming job did not run")
                self.fig_bulk(stream_job)
            except Exception as e:  # noqa: BLE001
                self.failed(("bulk",), names, e)
        for keys, fn in ((("rollback", "rollback_uvcache"), self.fig_rollback), (("status4",), self.fig_status4),
                         (("ps4_kept", "ps50"), self.fig_ps_kept)):
            if want(*keys):
                try:
                    fn()
                except Exception as e:  # noqa: BLE001
                    self.failed(keys, names, e)
        if only is not None:
            for k in list(self.figures):
                if k not in only:
                    del self.figures[k]
        return [self.figures[k] for k in ORDER if k in self.figures]


# ---- output --------------------------------------------------------------------------

def fmt(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit in ("ms", "MB/s", "MB", "% core"):
        digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
        return f"{v:.{digits}f} {unit}"
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    return f"{v:g} {unit}"


def fmt_ratio(r) -> str:
    return "—" if r is None else f"{r:.2f}×"


def met_text(m) -> str:
    return {True: "yes", False: "NO", None: "—"}[m]


def table(figs: list[Figure]) -> str:
    rows = [("figure", "ours", "baseline", "ratio", "target", "met?")]
    for f in figs:
        if f.error:
            rows.append((f.figure, "error", "", "", f.target, f.error[:60]))
        else:
            rows.append((f.figure, fmt(f.ours, f.unit), fmt(f.baseline, f.unit), fmt_ratio(f.ratio),
                         f.target, met_text(f.met)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = []
    for n, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine() -> dict:
    def run(*argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (p.stdout or p.stderr).strip()
        except OSError:
            return None
    cpu = None
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import paramiko
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory": run("free", "-h"), "uname": run("uname", "-a"),
            "python": platform.python_version(), "paramiko": paramiko.__version__,
            "openssh": run("ssh", "-V")}


def main(argv: list[str] | None = None, *, bed: TestBed | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition (seconds, no verdicts)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--reps", type=int, help="repetitions per figure (default 5; quick: 1)")
    ap.add_argument("--only", help="comma-separated figure keys: " + ", ".join(ORDER))
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.reps:
        sizes = Sizes(**dict(asdict(sizes), reps=args.reps, status_reps=max(args.reps, sizes.status_reps)))
    only = set(args.only.split(",")) if args.only else None
    started = time.time()
    with Bench(sizes, bed=bed) as b:
        figs = b.run(only)
    took = time.time() - started
    print(table(figs))
    print(f"\n{'quick' if args.quick else 'full'} run, {took:.0f} s; medians of {sizes.reps} interleaved "
          f"repetitions ({sizes.status_reps} for status4)" + (" — quick mode: sizes too small for verdicts"
                                                               if args.quick else ""))
    if args.json:
        out = {"mode": "quick" if args.quick else "full", "started": started, "seconds": round(took, 1),
               "command": "python -m bench" + (" --quick" if args.quick else ""),
               "sizes": asdict(sizes), "machine": machine(), "figures": [asdict(f) for f in figs]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if any(f.error for f in figs) else 0


if __name__ == "__main__":
    sys.exit(main())
