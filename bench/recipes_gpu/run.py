"""Each recipe's real trainer through gpujob on the ``local`` kind, side by side on one
GPU (issue 23 item 3): one lane per trainer, each with its own container home.

Per lane, two wheel profiles on the base interpreter (``system_site_packages``):
``compiled``, and ``broken`` = the same with ``TORCHDYNAMO_DISABLE=1`` (the compile
path broken: flex_attention runs eagerly). Act 1 starts on ``compiled`` (the
recipe's warmup, a few real steps, fills the compile cache) and runs until the
profile is known-good, then is stopped. Act 2 starts on ``broken``: gpujob must roll
it back by itself to ``compiled`` (onto the recipe's standby where the command is
``python SCRIPT``) and resume it from the trainer's own checkpoint of act 2; once
the resumed run has given ``--resumed-s`` seconds of samples the job is stopped.

    python3 -m bench.recipes_gpu.run --out recipes.json                # on the GPU machine
    python3 -m bench.recipes_gpu.run --device cpu --python VENV/bin/python --out cpu.json  # rehearsal

Figures per lane (JSON, rewritten after every step): tok/s per profile (medians of
the samples gpujob parsed), the known-good baseline, slowdown -> decision (the
broken run's first sample to the rollback decision), decision -> trainer start /
first sample / first good sample, the resume point, recovered % of the baseline,
the ledger's verdict on ``broken``, the trainer's version. Lanes run at the same
time, so each lane's rate moves with the others'.
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
import threading
import time
from pathlib import Path

from bench.gpu import BenchError, Figures, events, median, probe_torch, samples_by_profile
from bench.recipes_gpu.lanes import LANES, Lane

REPO = Path(__file__).resolve().parents[2]
ENDED = ("succeeded", "failed", "stopped", "lost")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.recipes_gpu.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--lanes", default=",".join(LANES), help=f"comma-separated, of {', '.join(LANES)}")
    p.add_argument("--out", default="recipes-gpu.json")
    p.add_argument("--python", default=os.environ.get("GPUJOB_BASE_PYTHON") or sys.executable,
                   help="the base interpreter holding torch and the trainers")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--deadline", type=float, default=520.0, help="seconds for everything")
    p.add_argument("--resumed-s", type=float, default=25.0,
                   help="seconds of resumed samples before act 2 stops")
    p.add_argument("--workdir", default=None, help="keep everything here (default: a temp dir, removed)")
    p.add_argument("--keep", default=None, help="copy each act's supervisor trace, spec and logs here")
    p.add_argument("--init-keys", action="store_true", help="judge with what `gpujob init` writes "
                   "(min_ratio 0.8, tokens_per_step) and gpujob's defaults, good_after 20s (lanes.INIT_KEYS)")
    p.add_argument("--good-runs", type=int, default=0, help="between the acts: this many more jobs on "
                   "compiled, judged against act 1's baseline, each stopped after --good-s of samples")
    p.add_argument("--good-s", type=float, default=40.0)
    p.add_argument("--via-init", action="store_true",
                   help="each lane's spec written by `gpujob init --recipe "
                   "R -t lab/LANE -- COMMAND`, then only its CHANGE ME edits (lanes.via_init)")
    p.add_argument("--specforge-data", default=None, help="specforge lane: the tiny target and features "
                   "(bench/recipes_gpu/specforge_tiny.py --out DIR)")
    return p.parse_args(argv)


class Lanes:
    """One hosts.yaml with a container home per lane, and the gpujob CLI over it."""

    def __init__(self, args, tmp: Path, names: list):
        self.args, self.tmp = args, tmp
        hosts = tmp / "hosts.yaml"
        self.roots = {n: tmp / "homes" / n for n in names}
        hosts.write_text(json.dumps({"hosts": {"lab": {
            "kind": "local", "env_passthrough": ["NCCL_*", "TORCH_SYMM_MEM_*", "NVSHMEM_*", "LD_LIBRARY_PATH",
                                                 "CUDA_HOME", "PYTHONPATH"],
            "containers": {n: {"root": str(r)} for n, r in self.roots.items()}}}}))
        self.env = dict(os.environ, GPUJOB_HOSTS=str(hosts), XDG_STATE_HOME=str(tmp / "state"),
                        HOME=str(tmp / "home"), COLUMNS="160", UV_OFFLINE="1", UV_PYTHON_DOWNLOADS="never",
                        PYTHONUNBUFFERED="1")
        (tmp / "home").mkdir(exist_ok=True)

    def cli(self, *argv, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpujob.entry", *argv], env=self.env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)

    def submit(self, lane: str, spec: Path, profile: str, sets: list) -> str:
        argv = ["submit", str(spec), "--profile", profile, "--force"]
        for s in sets:
            argv += ["--set", s]
        p = self.cli(*argv, timeout=600)
        for line in p.stdout.splitlines():
            if line.startswith("submitted "):
                return line.split()[1]
        raise BenchError(f"{lane}: submit on {profile} failed (exit {p.returncode}): "
                         f"{(p.stdout + p.stderr).strip()[-900:]}")

    def state(self, lane: str, job: str) -> dict:
        try:
            return json.loads((self.roots[lane] / "jobs" / job / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, lane: str, job: str, until: float) -> dict:
        self.cli("stop", job, timeout=120)
        while time.time() < until:
            st = self.state(lane, job)
            if st.get("state") in ENDED:
                return st
            time.sleep(1)
        return self.state(lane, job)

    def keep(self, lane: str, job: str, tag: str) -> None:
        """The act's trace.jsonl.gz (for replay tests), its job.json (the spec) and logs."""
        if not self.args.keep:
            return
        dest = Path(self.args.keep)
        dest.mkdir(parents=True, exist_ok=True)
        src = self.roots[lane] / "jobs" / job
        for name, to in (("trace.jsonl.gz", "trace.jsonl.gz"), ("job.json", "job.json"),
                         ("job.log", "job.log"),
                         ("events.jsonl", "events.jsonl"), ("warmup.log", "warmup.log")):
            if (src / name).exists():
                shutil.copy(src / name, dest / f"{lane}_{tag}.{to}")

    def tail(self, lane: str, job: str, name: str = "job.log", size: int = 1500) -> str:
        try:
            return (self.roots[lane] / "jobs" / job / name).read_text(errors="replace")[-size:]
        except OSError:
            return ""


def wait(pred, until: float, every: float = 1.0):
    while time.time() < until:
        got = pred()
        if got:
            return got
        time.sleep(every)
    return None


def run_lane(b: Lanes, lane: Lane, figures: Figures, end: float, resumed_s: float) -> dict:
    """Act 1 then act 2 for one lane; its figures."""
    name, root = lane.name, b.roots[lane.name]
    spec, sets = lane.spec(b.tmp / name, b.args)
    out: dict = {"trainer": lane.trainer, "spec": str(spec.name), "sets": sets}
    figures.set(**{name: out})
    job1 = b.submit(name, spec, "compiled", sets)
    out["act1"] = {"job": job1}

    def act1_done():
        ev = events(root, job1)
        return any(e["type"] == "known_good" for e in ev) or b.state(name, job1).get("state") in ENDED
    wait(act1_done, end - 120, every=2)
    ev1 = events(root, job1)
    known = [e for e in ev1 if e["type"] == "known_good"]
    st1 = b.stop(name, job1, min(end, time.time() + 90))
    b.keep(name, job1, "act1")
    fast = samples_by_profile(root, job1).get("compiled", [])
    warm = [e for e in ev1 if e["type"] == "phase" and e.get("phase") == "warmup"]
    out["act1"].update(state=st1.get("state"), reason=st1.get("reason"), samples=len(fast),
                       compiled_tok_s=median(fast), known_good=bool(known),
                       baseline=known[0].get("baseline") if known else None,
                       warmup_ran=bool(warm), seconds=round(time.time() - ev1[0]["t"], 1) if ev1 else None)
    figures.set(**{name: out})
    if not known:
        raise BenchError(f"{name}: act 1: compiled never became known-good ({len(fast)} samples, "
                         f"state {st1.get('state')}: {st1.get('reason')}); log: {b.tail(name, job1)}")
    base = known[0].get("baseline") or median(fast)
    out["good_runs"] = []
    for k in range(b.args.good_runs):
        if time.time() > end - 200:
            break
        out["good_runs"].append(good_run(b, lane, spec, sets, end))
        figures.set(**{name: out})
    lane.between_acts(root)
    job2 = b.submit(name, spec, "broken", sets)
    out["act2"] = {"job": job2}

    def resumed_enough():
        st = b.state(name, job2)
        if st.get("state") in ENDED:
            return True
        rb = [r for r in st.get("rollbacks") or [] if r.get("signal") != "manual"]
        good = (rb[0].get("timings") or {}).get("first_good") if rb else None
        if good is None:
            return False
        after = [e for e in _samples(root, job2) if e.get("profile") == "compiled"]
        return after and after[-1]["t"] - after[0]["t"] >= resumed_s
    wait(resumed_enough, end - 30, every=2)
    st2 = b.stop(name, job2, min(end, time.time() + 60))
    b.keep(name, job2, "act2")
    out["act2"].update(figures2(b, name, job2, st2, base))
    trace2 = root / "jobs" / job2 / "trace.jsonl.gz"
    out["act2"]["counter"] = counter_check(trace2, name, lane.tokens_per_step(b.args),
                                           out["act2"].get("resumed_tok_s"))
    if lane.tokens_per_step(b.args):
        for tag, job, resumed in (("act1", job1, False), ("act2", job2, True)):
            try:
                out[tag]["counter_vs_gpujob"] = counter_vs_samples(root / "jobs" / job / "trace.jsonl.gz",
                                                                   name,
                                                                   lane.tokens_per_step(b.args), resumed)
            except (OSError, KeyError, IndexError, ValueError) as e:
                out[tag]["counter_vs_gpujob"] = {"error": f"{type(e).__name__}: {e}"}
    if b.args.via_init:
        try:
            out["hand_edits"] = json.loads((b.tmp / name / "hand_edits.json").read_text())
        except (OSError, ValueError):
            pass
    figures.set(**{name: out})
    if not out["act2"].get("rollback"):
        raise BenchError(f"{name}: act 2: broken was not rolled back (state {st2.get('state')}: "
                         f"{st2.get('reason')}); log: {b.tail(name, job2)}")
    return out


JUDGED = ("rollback", "rollback_held", "judging_suspended", "no_recovery")


def good_run(b: Lanes, lane: Lane, spec: Path, sets: list, end: float) -> dict:
    """One more job on the known-good profile, stopped after --good-s seconds of samples:
    what the judge said of it (a right judge: no rollback verdict)."""
    name, root = lane.name, b.roots[lane.name]
    job = b.submit(name, spec, "compiled", sets)

    def enough():
        if b.state(name, job).get("state") in ENDED:
            return True
        ss = _samples(root, job)
        return ss and ss[-1]["t"] - ss[0]["t"] >= b.args.good_s
    wait(enough, min(end - 150, time.time() + b.args.good_s + 150), every=2)
    st = b.stop(name, job, min(end, time.time() + 60))
    ev = events(root, job)
    verdicts: dict = {}
    for e in ev:
        if e["type"] == "decision":
            verdicts[e.get("verdict")] = verdicts.get(e.get("verdict"), 0) + 1
    ss = [e for e in _samples(root, job) if e.get("profile") == "compiled"]
    return {"job": job, "state": st.get("state"), "samples": len(ss),
            "span_s": round(ss[-1]["t"] - ss[0]["t"], 1) if ss else 0,
            "tok_s": median([e["value"] for e in ss if "value" in e]) if ss else None,
            "judged": [{k: e.get(k) for k in ("type", "reason", "t")} for e in ev if e["type"] in JUDGED],
            "decision_verdicts": verdicts}


def _samples(root: Path, job: str) -> list:
    path = root / "jobs" / job / "samples.jsonl"
    out = []
    for ln in path.read_bytes().splitlines() if path.exists() else []:
        ln = ln.lstrip(b"\0")
        if ln.strip():
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass
    return out


def figures2(b: Lanes, name: str, job: str, st: dict, base) -> dict:
    root = b.roots[name]
    ev = events(root, job)
    samples = _samples(root, job)
    per = samples_by_profile(root, job)
    rolled = [r for r in st.get("rollbacks") or [] if r.get("signal") != "manual"]
    out: dict = {"state": st.get("state"), "reason": st.get("reason"),
                 "broken_tok_s": median(per.get("broken", [])), "broken_samples": len(per.get("broken", []))}
    if not rolled:
        return out
    rb = rolled[0]
    first_broken = next((s["t"] for s in samples if s.get("profile") == "broken"), None)
    decided = rb.get("decided_at")
    resumed = [s["value"] for s in samples if s.get("profile") == "compiled"]
    settled = resumed[len(resumed) // 4:]  # the resumed run's first quarter is its ramp
    ledger = [e for e in ev if e["type"] in ("suspect_confirmed", "not_promoted", "warning")
              and ("broken" in json.dumps(e))]
    out.update(rollback={k: rb.get(k) for k in ("from", "to", "signal", "reason", "took", "timings",
                                                "resumed")},
               slowdown_to_decision_s=round(decided - first_broken, 2) if decided and first_broken else None,
               decision_to_first_good_s=(rb.get("timings") or {}).get("first_good"),
               standby_used=any(e["type"] == "standby_used" for e in ev),
               save_waited_s=round(sum(e.get("waited", 0) for e in ev if e["type"] == "save_waited"), 2),
               held_for_checkpoint=[e for e in ev if e["type"] in ("rollback_held", "rollback_released")],
               resume_point=next((e for e in ev if e["type"] == "resume_point"), None),
               resumed_tok_s=median(settled), resumed_samples=len(resumed),
               recovered_pct_of_baseline=round(100 * median(settled) / base, 1) if settled and base else None,
               ledger_events=ledger[-3:], train_argv=[e.get("argv") for e in ev if e["type"] == "phase"
                                                      and e.get("phase") == "train"])
    return out


ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: the trainer's own step counter in its lines: Lightning's bar (N/? or N/TOTAL), torchtitan's step: N
COUNTERS = {"lightning": re.compile(r"\|\s*(\d+)/(?:\?|\d+) \["),
            "torchtitan": re.compile(r"\bstep:\s*(\d+)\b")}


def counter_runs(trace: Path, lane: str, samples: bool = False) -> list:
    """Per run of a job's trace ({profile, phase, resume}): ``points``, [(t, step), ...] as the
    trainer's own counter printed them (one entry per new step); with ``samples``, also the
    train runs' [(t, value), ...] that gpujob's own line source reads from the same lines."""
    from gpujob.agent.base.trace import read_records
    rx = COUNTERS.get(lane)
    runs: list = []
    if rx is None or not trace.exists():
        return runs
    recs = read_records(str(trace))
    src = None
    if samples and recs:
        from gpujob.agent.judge.sources import line_source
        src = line_source(recs[0]["meta"]["throughput"])
    for rec in recs[1:]:
        if isinstance(rec.get("run"), dict):
            runs.append(dict(rec["run"], points=[], samples=[]))
        elif "out" in rec and runs:
            run, line = runs[-1], str(rec["out"])
            got = src.from_line(line, rec["t"]) if src is not None and run.get("phase") == "train" else None
            if got:
                run["samples"].append((rec["t"], got[0]))
            m = rx.search(ANSI.sub("", line))
            pts = run["points"]
            if m and (not pts or int(m.group(1)) > pts[-1][1]):
                pts.append((rec["t"], int(m.group(1))))
    return runs


def counter_check(trace: Path, lane: str, tokens_per_step: float | None,
                  gpujob_resumed: float | None) -> dict:
    """The fresh run's first step, and the resumed run's rate by the trainer's own counter
    (steps over time, its first quarter left out as gpujob's figure does) against gpujob's."""
    runs = counter_runs(trace, lane)
    train = [r for r in runs if r.get("phase") == "train"]
    out: dict = {"fresh_first_step": next((r["points"][0][1] for r in train if not r.get("resume")
                                           and r["points"]),
                                          None)}
    resumed = next((r for r in train if r.get("resume") and len(r["points"]) > 8), None)
    if resumed is None:
        return out
    pts = resumed["points"]
    a, b = pts[len(pts) // 4], pts[-1]
    steps_s = (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else None
    out.update(resumed_first_step=pts[0][1], counter_steps_s=round(steps_s, 2) if steps_s else None)
    if steps_s and tokens_per_step:
        out["counter_tok_s"] = round(steps_s * tokens_per_step, 1)
        if gpujob_resumed:
            out["gpujob_over_counter"] = round(gpujob_resumed / out["counter_tok_s"], 3)
    return out


def counter_vs_samples(trace: Path, lane: str, tokens_per_step: float, resumed: bool | None = None) -> dict:
    """One train run of a kept trace (the resumed one, or the first with ``resumed=False``):
    the median of the samples gpujob's own line source reads from its lines (its first quarter
    left out) against the trainer's step counter over the same span: its mean (saves and evals
    included) and the median of its 1 s windows (like gpujob's samples, between saves)."""
    import statistics
    want = [r for r in counter_runs(trace, lane, samples=True) if r.get("phase") == "train"
            and (resumed is None or bool(r.get("resume")) == resumed) and len(r["samples"]) > 8]
    if not want:
        return {}
    run = want[-1] if resumed is not False else want[0]
    samples, pts = run["samples"], run["points"]
    q = len(samples) // 4
    t0 = samples[q][0]
    gj = statistics.median(v for _, v in samples[q:])
    pts = [p for p in pts if p[0] >= t0]
    if len(pts) < 3:
        return {"gpujob_median": round(gj, 1)}
    mean = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) * tokens_per_step
    win, j = [], 0
    for t, n in pts:
        while j < len(pts) and pts[j][0] < t + 1.0:
            j += 1
        if j < len(pts):
            win.append((pts[j][1] - n) / (pts[j][0] - t) * tokens_per_step)
    w = statistics.median(win) if win else None
    return {"gpujob_median": round(gj, 1), "counter_mean": round(mean, 1),
            "counter_1s_median": round(w, 1) if w else None,
            "over_mean": round(gj / mean, 3), "over_1s": round(gj / w, 3) if w else None,
            "samples": len(samples)}


def main(argv=None) -> int:
    args = parse_args(argv)
    figures = Figures(args.out)
    t0 = time.time()
    end = t0 + args.deadline
    names = [n.strip() for n in args.lanes.split(",") if n.strip()]
    unknown = [n for n in names if n not in LANES]
    if unknown:
        print(f"bench.recipes_gpu: unknown lane(s) {', '.join(unknown)}; known: {', '.join(LANES)}",
              file=sys.stderr)
        return 2
    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="gpujob-recipes-gpu-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        info = probe_torch(args.python, args.device)
    except BenchError as e:
        figures.set(status="failed", error=str(e))
        print(f"bench.recipes_gpu: FAILED: {e}", file=sys.stderr)
        return 1
    figures.set(machine=dict(info, python=args.python, device=args.device), lanes=names)
    b = Lanes(args, tmp, names)
    errors: dict = {}

    def one(lane: Lane):
        try:
            figures.set(**{f"{lane.name}_version": lane.version(args.python)})
            run_lane(b, lane, figures, end, args.resumed_s)
        except BenchError as e:
            errors[lane.name] = str(e)
        except Exception as e:  # a bug of the bench itself: that lane's figures say so
            errors[lane.name] = f"{type(e).__name__}: {e}"
    threads = [threading.Thread(target=one, args=(LANES[n],), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, end + 60 - time.time()))
    figures.set(status="failed" if errors else "done", errors=errors, seconds=round(time.time() - t0, 1),
                workdir=str(tmp))
    for n in names:  # never leave a trainer on the GPU
        for job in (figures.data.get(n) or {}).get("act1", {}).get("job"), \
                   (figures.data.get(n) or {}).get("act2", {}).get("job"):
            if job and b.state(n, job).get("state") not in ENDED:
                b.cli("stop", job, timeout=60)
    if not args.workdir:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(figures.data, indent=2, default=str))
    for n, e in errors.items():
        print(f"bench.recipes_gpu: {n}: FAILED: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
