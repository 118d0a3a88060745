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
             ``follow.follow_log`` (what ``gpujob logs -f`` runs) streams them;
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
             one after another (bench/psfan.py)
ps_cli       ``gpujob ps --json`` (the console script, served by the kept connection's
             daemon) over 4 hosts, warm / cold / GPUJOB_NO_DAEMON=1, against 4 ``ssh …
             pct exec 200 -- python3 … agent status JOB`` one after another; ps50: the
             same over 50 inventory entries on the one loopback sshd / over 1 of them
             (bench/psfan.py)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import figs_job, figs_link  # noqa: E402
from bench.harness import FULL, QUICK, Harness, Sizes  # noqa: E402
from bench.report import Figure, machine, table  # noqa: E402
from testbed import TestBed  # noqa: E402

ORDER = ("commands", "exec_cli", "exec_cli_cold", "exec_cli_nodaemon", "startup_version", "startup_help",
         "latency_p50", "latency_p99", "bulk", "rollback", "rollback_uvcache",
         "resubmit",
         "supervisor_cpu", "supervisor_rss", "ps_cli", "ps_cli_cold", "ps_cli_nodaemon", "ps50", "status4",
         "ps4_kept", "judge_replay")


def _judge_replay(h: Harness) -> None:
    """bench/judge_replay.py: no bed needed; the ratio to a bare reader of the same lines."""
    from bench import judge_replay
    got = judge_replay.measure(3)
    h.add(Figure("judge_replay", "replay of nanoGPT's 6.7 min (judge / bare reader CPU)", "CPU s",
                 "<= 10x a bare reader", ours=got["replay_cpu_s"], baseline=got["bare_cpu_s"],
                 ratio=round(got["bare_cpu_s"] / got["replay_cpu_s"], 3), met=got["ratio"] <= 10,
                 samples=got["samples"], note=f"{got['ratio']}x; us/line first/last quarter "
                 f"{got['us_per_line_first_quarter']}/{got['us_per_line_last_quarter']}"))


def run(h: Harness, only: set | None = None) -> list[Figure]:
    """Every figure asked for, in the order they share the bed; one failing does not stop the rest."""
    names = {"commands": "container commands", "exec_cli": "gpujob exec (whole CLI)",
             "exec_cli_cold": "gpujob exec, cold", "exec_cli_nodaemon": "gpujob exec, no daemon",
             "startup_version": "gpujob --version", "startup_help": "gpujob --help",
             "latency_p50": "logs -f latency p50", "latency_p99": "logs -f latency p99",
             "bulk": "logs -f bulk", "rollback": "rollback", "rollback_uvcache": "rollback (uv cache)",
             "resubmit": "resubmit",
             "supervisor_cpu": "supervisor CPU", "supervisor_rss": "supervisor RSS",
             "status4": "gpujob ps over 4 hosts", "ps4_kept": "gpujob ps over 4 hosts, kept",
             "ps50": "gpujob ps over 50 hosts", "ps_cli": "gpujob ps over 4 hosts (whole CLI)",
             "ps_cli_cold": "gpujob ps, cold", "ps_cli_nodaemon": "gpujob ps, no daemon",
             "judge_replay": "replay of nanoGPT's 6.7 min (judge / bare reader CPU)"}
    want = lambda *keys: only is None or any(k in only for k in keys)  # noqa: E731
    steps = [(("commands",), figs_link.commands),
             (("exec_cli", "exec_cli_cold", "exec_cli_nodaemon", "startup_version", "startup_help"),
              figs_link.exec_cli),
             (("resubmit",), figs_job.resubmit), (("judge_replay",), _judge_replay)]
    for keys, fn in steps:
        if want(*keys):
            try:
                fn(h)
            except Exception as e:  # noqa: BLE001 - one figure failing does not stop the run
                h.failed(keys, names, e)
    stream_job = None
    keys = ("latency_p50", "latency_p99", "supervisor_cpu", "supervisor_rss")
    if want(*keys, "bulk", "rollback"):
        try:
            stream_job = figs_job.stream(h)
        except Exception as e:  # noqa: BLE001
            h.failed(keys, names, e)
    if want("bulk"):
        try:
            if stream_job is None:
                raise RuntimeError("the streaming job did not run")
            figs_job.bulk(h, stream_job)
        except Exception as e:  # noqa: BLE001
            h.failed(("bulk",), names, e)
    for keys, fn in ((("rollback", "rollback_uvcache"), figs_job.rollback), (("status4",), figs_link.status4),
                     (("ps_cli", "ps_cli_cold", "ps_cli_nodaemon", "ps50"), figs_link.ps_cli),
                     (("ps4_kept",), figs_link.ps_kept)):
        if want(*keys):
            try:
                fn(h)
            except Exception as e:  # noqa: BLE001
                h.failed(keys, names, e)
    if only is not None:
        for k in list(h.figures):
            if k not in only:
                del h.figures[k]
    return [h.figures[k] for k in ORDER if k in h.figures]


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
    with Harness(sizes, bed=bed) as h:
        figs = run(h, only)
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
