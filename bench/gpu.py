"""The GPU benchmark of issue 15: gpujob on the ``local`` target running the
DFlash-like example (jobs/dflash-mini.yaml) on real GPUs, in two acts.

Act 1: profile ``fast`` (flex_attention compiled) warms its cache per drafter GPU,
trains and becomes known-good. Act 2: profile ``slow`` (flex_attention eager)
trains, falls under the floor, is rolled back automatically to ``fast`` (held
until the first checkpoint exists) and resumes from that checkpoint.

    GPUJOB_BASE_PYTHON=$(which python3) python3 -m bench.gpu --gpus 0 --out gpu.json
    python3 -m bench.gpu --gpus 0,1,2,3 --out gpu.json     # target on 0, drafters 1-3
    python3 -m bench.gpu --device cpu --small --out cpu.json   # a smoke test, no GPU

Figures (JSON, rewritten after each step so a failure leaves what was measured):
tok/s per profile (medians of the samples gpujob parsed), recovered % of the
baseline, cold vs warm first step, decision → trainer start / first sample /
first good sample / first ok, the resume point, supervisor CPU seconds and peak
RSS (/proc), GPU utilisation (nvidia-smi, sampled every second). Any failure
ends the run with exit 1 and a one-line reason, in the JSON too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
T_START = time.time()
PASSTHROUGH = ["NCCL_*", "TORCH_SYMM_MEM_*", "NVSHMEM_*", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"]


class BenchError(Exception):
    pass


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default="0", help="GPU indices, comma-separated: 1 GPU = both roles on it; "
                   "more = the first holds the target model, the rest one drafter each")
    p.add_argument("--out", default="bench-gpu.json")
    p.add_argument("--python", default=os.environ.get("GPUJOB_BASE_PYTHON") or sys.executable,
                   help="the base interpreter holding torch (default: $GPUJOB_BASE_PYTHON, else this one)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small", action="store_true", help="tiny model sizes (CPU smoke test)")
    p.add_argument("--train-seconds", type=float, default=40.0, help="each trainer run's --time-limit")
    p.add_argument("--workdir", default=None, help="keep everything here (default: a temp dir, removed)")
    p.add_argument("--deadline", type=float, default=450.0, help="seconds for the whole run (acts included)")
    return p.parse_args(argv)


class Figures:
    """The JSON written after every step."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.data: dict = {"status": "running", "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        self.write()

    def set(self, **kw) -> None:
        self.data.update(kw)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


class Sampler(threading.Thread):
    """Every second: GPU utilisation (nvidia-smi) and the supervisor's CPU time and
    RSS (/proc/PID), the supervisor's PID read from the running job's state.json."""

    def __init__(self, root: Path, gpus: list, use_smi: bool):
        super().__init__(daemon=True)
        self.root, self.gpus, self.use_smi = root, gpus, use_smi
        self.gpu: list = []  # (t, {gpu: util})
        self.sup: dict = {}  # pid -> {"cpu_s", "rss_kib", "hwm_kib"}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            if self.use_smi:
                self.gpu.append((time.time(), nvidia_smi()))
            for state in self.root.glob("jobs/*/state.json"):
                try:
                    pid = json.loads(state.read_text()).get("supervisor_pid")
                    if pid:
                        self.sup[pid] = dict(proc_stats(pid), job=state.parent.name)
                except (OSError, ValueError):
                    pass

    def gpu_util(self, t0: float, t1: float) -> dict:
        seen = [u for t, u in self.gpu if t0 <= t <= t1 and u]
        return {str(g): round(statistics.mean(s[g] for s in seen if g in s), 1)
                for g in self.gpus if any(g in s for s in seen)}


def nvidia_smi() -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(a): float(b) for a, b in (ln.split(",") for ln in out.splitlines() if ln.count(",") == 1)}


def proc_stats(pid: int) -> dict:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    out = {"cpu_s": round((int(fields[11]) + int(fields[12])) / ticks, 2)}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out["rss_kib" if line.startswith("VmRSS") else "hwm_kib"] = int(line.split()[1])
    return out


def probe_torch(python: str, device: str) -> dict:
    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'gpus': torch.cuda.device_count() if torch.cuda.is_available() else 0, "
            "'names': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))")
    p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise BenchError(f"{python} cannot import torch: "
                         f"{p.stderr.strip().splitlines()[-1:] or p.returncode}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if device == "cuda" and not info["gpus"]:
        raise BenchError(f"torch {info['torch']} in {python} sees no GPU (use --device cpu for a smoke test)")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    info["driver"] = (smi.stdout.strip().splitlines()[0] if smi and smi.returncode == 0
                      and smi.stdout.strip() else None)
    return info


def make_spec(args, tmp: Path, gpus: list, info: dict) -> Path:
    import yaml
    spec = yaml.safe_load((REPO / "jobs" / "dflash-mini.yaml").read_text())
    rb = spec.get("rollback") or {}
    if True in rb:  # YAML 1.1 (PyYAML) reads the key `on` as true; gpujob's loader does not
        rb["on"] = rb.pop(True)
    spec["target"] = "box"
    spec["sync"][0]["src"] = str(REPO / "jobs" / "dflash_mini")
    spec["gpus"] = {"drafter": gpus} if len(gpus) == 1 else {"target": gpus[:1], "drafter": gpus[1:]}
    for prof in spec["profiles"]:
        prof["python"] = args.python
        prof["cuda"] = info["cuda"]  # verified against what the venv imports; None: no CUDA build
        if not prof["cuda"]:
            del prof["cuda"]
        if args.device == "cpu" and prof["name"] == "slow":  # on CPU both run SDPA: slow stands in
            prof["env"]["DFLASH_CPU_STEP_DELAY"] = "0.05"
    if args.device == "cpu":  # a CPU shared with other work is noisy: a lower floor for the smoke test
        spec["throughput"]["min_ratio"] = 0.4
    sizes = "--seq-len 128 --hidden 64 --heads 4 --vocab 512 --batch 2" if args.small else ""
    dev = f"--device {args.device}"
    spec["warmup"]["command"] = f"python trainer.py --warmup {dev} {sizes}"
    spec["train"]["command"] = (f"python trainer.py {dev} {sizes} --time-limit {args.train_seconds:g} "
                                "--ckpt-dir ckpt --ckpt-every 5")
    path = tmp / "dflash-mini.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def events(root: Path, job: str) -> list:
    path = root / "jobs" / job / "events.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def first_steps(text: str) -> list:
    return [float(x) for x in re.findall(r"first_step_s=([\d.]+)", text)]


def samples_by_profile(root: Path, job: str) -> dict:
    """{profile: [tok/s, ...]} from the job's full-rate samples (samples.jsonl)."""
    path = root / "jobs" / job / "samples.jsonl"
    out: dict = {}
    for ln in path.read_bytes().splitlines() if path.exists() else []:
        ln = ln.lstrip(b"\0")
        if ln.strip():
            rec = json.loads(ln)
            out.setdefault(rec.get("profile"), []).append(rec["value"])
    return out


def median(values: list):
    return round(statistics.median(values), 1) if values else None


class Bench:
    def __init__(self, args, tmp: Path, figures: Figures):
        self.args, self.tmp, self.fig = args, tmp, figures
        self.root = tmp / "root"
        hosts = tmp / "hosts.yaml"
        hosts.write_text(json.dumps({"hosts": {"lab": {"kind": "local", "env_passthrough": PASSTHROUGH,
                                                       "containers": {"box": {"root": str(self.root)}}}}}))
        self.env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"),
                        COLUMNS="160", UV_OFFLINE="1", UV_PYTHON_DOWNLOADS="never", PYTHONUNBUFFERED="1")

    def submit(self, spec: Path, profile: str, act: str, timeout: float) -> tuple:
        t0 = time.time()
        log = self.tmp / f"{act}.out"
        try:
            with open(log, "wb") as out:
                p = subprocess.run([sys.executable, "-m", "gpujob.cli.main", "submit", str(spec), "--profile",
                                    profile, "--follow", "--force"], env=self.env, cwd=REPO, stdout=out,
                                   stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            m = re.search(r"^submitted (\S+) ", log.read_text(errors="replace"), re.M)
            if m:  # the supervisor runs detached: stop the job, do not leave the GPU busy
                subprocess.run([sys.executable, "-m", "gpujob.cli.main", "stop", m.group(1)], env=self.env,
                               cwd=REPO, capture_output=True, timeout=120)
            raise BenchError(f"{act}: out of time after {timeout:.0f}s (--deadline); "
                             f"last lines: {log.read_text(errors='replace').strip()[-600:]}") from None
        text = log.read_text(errors="replace")
        m = re.search(r"^submitted (\S+) ", text, re.M)
        if not m:
            raise BenchError(f"{act}: submit failed (exit {p.returncode}): {text.strip()[-600:]}")
        job = m.group(1)
        state = json.loads((self.root / "jobs" / job / "state.json").read_text())
        if p.returncode != 0 or state.get("state") != "succeeded":
            tail = (self.root / "jobs" / job / "job.log").read_text(errors="replace")[-1500:]
            raise BenchError(f"{act}: job {job} ended {state.get('state')}: {state.get('reason')}\n{tail}")
        return job, state, t0, time.time()


def act2(b: "Bench", sampler, spec: Path, act: str, timeout: float, base) -> dict:
    """The slow profile, rolled back to fast automatically and resumed: its figures."""
    job2, st2, c0, c1 = b.submit(spec, "slow", act, timeout)
    ev2 = events(b.root, job2)
    per = samples_by_profile(b.root, job2)
    rolled = [r for r in st2.get("rollbacks") or [] if r.get("signal") != "manual"]
    if not rolled:
        raise BenchError(f"{act}: the slow profile was not rolled back ({median(per.get('slow', []))} tok/s)")
    rb = rolled[0]
    resumed_log = (b.root / "jobs" / job2 / "train.log").read_text(errors="replace")
    held = [e for e in ev2 if e["type"] in ("rollback_held", "rollback_released")]
    resumed = median(per.get("fast", []))
    return {"job": job2, "seconds": round(c1 - c0, 1), "slow_tok_s": median(per.get("slow", [])),
            "resumed_fast_tok_s": resumed,
            "recovered_pct_of_baseline": round(100 * resumed / base, 1) if resumed and base else None,
            "rollback": {k: rb.get(k) for k in ("from", "to", "signal", "reason", "took", "timings",
                                                "resumed")},
            "decision_to_first_good_s": (rb.get("timings") or {}).get("first_good"),
            "standby_used": any(e["type"] == "standby_used" for e in ev2),
            "held_for_checkpoint": held,
            "first_step_resumed_s": (first_steps(resumed_log) or [None])[-1],
            "gpu_util": sampler.gpu_util(c0, c1)}


def run(args, figures: Figures) -> None:
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    info = probe_torch(args.python, args.device)
    if args.device == "cuda" and max(gpus) >= info["gpus"]:
        raise BenchError(f"--gpus {args.gpus}: torch sees {info['gpus']} GPU(s)")
    figures.set(machine={"torch": info["torch"], "cuda": info["cuda"], "driver": info["driver"],
                         "gpu_names": info["names"], "python": args.python, "device": args.device,
                         "gpus": gpus})
    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="gpujob-bench-gpu-"))
    tmp.mkdir(parents=True, exist_ok=True)
    b = Bench(args, tmp, figures)
    spec = make_spec(args, tmp, gpus, info)
    sampler = Sampler(b.root, gpus, args.device == "cuda" and shutil.which("nvidia-smi") is not None)
    sampler.start()
    try:
        end = T_START + args.deadline

        def budget(act: str) -> float:
            left = end - time.time()
            if left < 30:
                raise BenchError(f"{act}: only {left:.0f}s of --deadline {args.deadline:g}s left")
            return left
        job1, st1, a0, a1 = b.submit(spec, "fast", "act1", budget("act1"))
        ev1 = events(b.root, job1)
        warm_log = (b.root / "jobs" / job1 / "warmup.log").read_text(errors="replace")
        train_log = (b.root / "jobs" / job1 / "train.log").read_text(errors="replace")
        fast = samples_by_profile(b.root, job1).get("fast", [])
        known = [e for e in ev1 if e["type"] == "known_good"]
        figures.set(act1={"job": job1, "seconds": round(a1 - a0, 1), "fast_tok_s": median(fast),
                          "samples": len(fast), "known_good": bool(known),
                          "baseline": known[0]["baseline"] if known else None,
                          "first_step_cold_s": (first_steps(warm_log) or [None])[0],
                          "first_step_warm_s": (first_steps(train_log) or [None])[0],
                          "env_build_s": [e.get("seconds") for e in ev1 if e["type"] == "env_ready"],
                          "gpu_util": sampler.gpu_util(a0, a1)})
        if not known:
            raise BenchError(f"act 1: profile fast never became known-good ({len(fast)} samples)")
        base = median(fast)
        # act 2 twice: with the standby interpreter (the spec's train.standby), then without
        no_standby = spec.with_name("dflash-mini-nostandby.yaml")
        import yaml
        plain = yaml.safe_load(spec.read_text())
        if True in plain.get("rollback", {}):  # PyYAML reads the key `on` as true
            plain["rollback"]["on"] = plain["rollback"].pop(True)
        plain["train"].pop("standby", None)
        no_standby.write_text(yaml.safe_dump(plain, sort_keys=False))
        for act, path in (("act2", spec), ("act2_no_standby", no_standby)):
            shutil.rmtree(b.root / "work" / "dflash-mini" / "ckpt", ignore_errors=True)  # each starts afresh
            figures.set(**{act: act2(b, sampler, path, act, budget(act), base)})
    finally:
        sampler.stop.set()
        sampler.join(5)
        figures.set(supervisor={str(pid): s for pid, s in sampler.sup.items()}, workdir=str(tmp))
        if not args.workdir:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    figures = Figures(args.out)
    t0 = time.time()
    try:
        run(args, figures)
    except BenchError as e:
        figures.set(status="failed", error=str(e), seconds=round(time.time() - t0, 1))
        print(f"bench.gpu: FAILED: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug of the bench itself: say so, with the traceback
        figures.set(status="failed", error=f"{type(e).__name__}: {e}", seconds=round(time.time() - t0, 1))
        traceback.print_exc()
        print(f"bench.gpu: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    figures.set(status="done", seconds=round(time.time() - t0, 1))
    print(json.dumps(figures.data, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
