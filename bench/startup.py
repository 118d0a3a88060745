"""The CLI's start-up (issue 24): whole processes of the installed console script, as
users run it, started and reaped from here; medians, repetitions interleaved.

version      ``gpujob --version`` (answered by the entry: goal <= 150 ms)
help         ``gpujob --help`` (typer's help: goal <= 400 ms)
CMD_help     ``gpujob CMD --help`` for every command: its start, up to its body (<= 400 ms)
complete     one Tab: ``_GPUJOB_COMPLETE=complete_bash`` for ``gpujob logs `` (job ids from
             the laptop's index; goal <= 150 ms, as --version)
disconnect   ``gpujob disconnect`` with no kept connection open (the entry's fast path)

warm: repeated runs (bytecode and page cache hot), wall and cpu (user + system); cold
(``--cold``, needs root): the first run after ``echo 3 > /proc/sys/vm/drop_caches``, as after a
reboot. No test bed: nothing here reaches a target.

    python -m bench.startup [--reps 7] [--cold] [--gpujob PATH [--gpujob PATH]] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOALS_MS = {"version": 150, "complete": 150, "disconnect": 150}
DEFAULT_GOAL_MS = 400


def console_script() -> str:
    return str(Path(sys.executable).parent / "gpujob")


def cases(gj: str) -> dict[str, list[str]]:
    """name → argv: the fast answers, the root's help, and every command's start."""
    cmds = ["exec", "disconnect", "doctor", "hosts", "submit", "logs", "status", "plot", "ps", "stop",
            "rollback", "profiles", "gc", "demo", "recipes", "init", "replay", "completion", "cache ls",
            "ledger set"]
    out = {"version": [gj, "--version"], "help": [gj, "--help"], "complete": [gj],
           "disconnect": [gj, "disconnect"]}
    for c in cmds:
        out[c.replace(" ", "_") + "_help"] = [gj, *c.split(), "--help"]
    return out


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall, cpu) seconds of one whole process: cpu (user + system, from wait4) moves less
    than wall when other work shares the machine."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd=str(REPO))
    _, status, ru = os.wait4(p.pid, 0)
    took = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 2):
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}")
    return took, ru.ru_utime + ru.ru_stime


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(scripts: list[str], reps: int, cold: bool) -> dict:
    """Each case for each script in turn (A B A B ...), so a drift of the machine's speed
    falls on all of them alike."""
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-bench-start-"))
    runtime = tmp / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), XDG_RUNTIME_DIR=str(runtime), COLUMNS="100")
    env.pop("GPUJOB_NO_DAEMON", None)
    envs = {"complete": dict(env, _GPUJOB_COMPLETE="complete_bash", COMP_WORDS="gpujob logs ",
                             COMP_CWORD="2")}
    todo = {gj: cases(gj) for gj in scripts}
    names = list(todo[scripts[0]])
    for gj in scripts:  # one untimed round: bytecode written, caches warm
        for name in names:
            timed(todo[gj][name], envs.get(name, env))
    wall = {gj: {k: [] for k in names} for gj in scripts}
    cpu = {gj: {k: [] for k in names} for gj in scripts}
    for _ in range(reps):
        for name in names:
            for gj in scripts:
                w, c = timed(todo[gj][name], envs.get(name, env))
                wall[gj][name].append(w)
                cpu[gj][name].append(c)
    res: dict = {"scripts": scripts, "runs": {}}
    for gj in scripts:
        res["runs"][gj] = {"warm_ms": {k: statistics.median(v) * 1000 for k, v in wall[gj].items()},
                           "warm_cpu_ms": {k: statistics.median(v) * 1000 for k, v in cpu[gj].items()},
                           "warm_s": wall[gj]}
    if cold:
        for gj in scripts:
            colds: dict[str, list[float]] = {k: [] for k in ("version", "help", "complete", "status_help")}
            for _ in range(3):
                for name in colds:
                    if not drop_caches():
                        res["cold"] = "not measured: /proc/sys/vm/drop_caches is not writable"
                        return res
                    colds[name].append(timed(todo[gj][name], envs.get(name, env))[0])
            res["runs"][gj]["cold_ms"] = {k: statistics.median(v) * 1000 for k, v in colds.items()}
    return res


def table(res: dict) -> str:
    scripts = res["scripts"]
    head = " | ".join(f"{label(gj)} warm wall / cpu | cold" for gj in scripts)
    rows = [f"| start | {head} | goal |", "|---" * (2 + 2 * len(scripts)) + "|"]
    first = res["runs"][scripts[0]]
    for name in first["warm_ms"]:
        goal = GOALS_MS.get(name, DEFAULT_GOAL_MS)
        cells = []
        for gj in scripts:
            r = res["runs"][gj]
            cold = r.get("cold_ms", {})
            cells.append(f"{r['warm_ms'][name]:.0f} / {r['warm_cpu_ms'][name]:.0f} ms | "
                         + (f"{cold[name]:.0f} ms" if name in cold else ""))
        last = res["runs"][scripts[-1]]["warm_ms"][name]
        rows.append(f"| {name} | {' | '.join(cells)} | ≤ {goal} ms{'' if last <= goal else ' (NOT met)'} |")
    return "\n".join(rows)


def label(gj: str) -> str:
    return Path(gj).resolve().parent.parent.parent.name or gj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cold", action="store_true", help="also the first run after dropping the page cache")
    ap.add_argument("--gpujob", action="append", help="a console script (default: this venv's); twice: "
                    "both, interleaved (e.g. the main checkout's before this one's)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    started = time.time()
    scripts = args.gpujob or [console_script()]
    res = run(scripts, args.reps, args.cold)
    print(table(res))
    load = os.getloadavg()
    print(f"\n{', '.join(scripts)}; medians of {args.reps}, interleaved; load average {load[0]:.1f} on "
          f"{os.cpu_count()} CPUs at the end")
    if args.json:
        res.update(started=started, reps=args.reps, loadavg_at_end=load,
                   python=platform.python_version(), nproc=os.cpu_count())
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
