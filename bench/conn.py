"""The kept connection (gpujob/conn), measured on the loopback test bed in one run,
repetitions interleaved, medians of whole processes (wall clock, started and reaped
from here):

ssh          ``ssh -i … root@127.0.0.1 -p PORT pct exec 200 -- true`` (OpenSSH client)
exec_warm    ``gpujob exec tb/ct200 -- true`` through the console entry, daemon warm
             (goal: ≥ 2× faster than ssh), with a second environment's daemon alive
exec_warm_b  the same from a second environment (another terminal: its own
             SSH_AUTH_SOCK), interleaved with the first: each keeps its own daemon
             (goal for both: ≥ 2× faster than ssh)
status_warm  ``gpujob status JOB`` of a finished job, daemon warm (goal: ≤ 150 ms)
exec_full    the same exec through the full CLI (GPUJOB_NO_DAEMON=1): imports + a new
             SSH connection + a new exec channel, as before the daemon
status_full  the same status through the full CLI
exec_cold    one exec that finds no daemon: it runs directly and starts one in the
             background for the next commands (disconnect before each)
ps_warm      ``gpujob ps``: the full CLI (typer, rich, …), its commands over the warm daemon
ps_full      the same with GPUJOB_NO_DAEMON=1 (a new SSH connection and exec channel)

    python -m bench.conn [--reps 15] [--json out.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from testbed import TestBed  # noqa: E402

GOALS = {"exec_warm": "≥ 2× faster than ssh", "status_warm": "≤ 150 ms",
         "exec_two_envs": "≥ 2× faster than ssh, each"}


def gpujob_argv() -> list[str]:
    """The installed console script when there is one (what a user runs), else the same
    entry module through -m."""
    script = Path(sys.executable).parent / "gpujob"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "gpujob.entry"]


def timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, cwd=str(REPO))
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} exited {p.returncode}: {p.stderr.decode()[-500:]}")
    return took


def sock_of(env: dict) -> Path:
    """The socket of env's kept connection (its key: uid, environment view, code stamp)."""
    from unittest import mock
    from gpujob.conn import paths
    with mock.patch.dict(os.environ, env, clear=True):
        return Path(paths.socket_path(create=False))


def end_starting(env: dict) -> None:
    """SIGKILL a daemon of this run that was still starting when the run ended."""
    mine = f"XDG_RUNTIME_DIR={env['XDG_RUNTIME_DIR']}".encode()
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"gpujob.daemon\0serve" in open(f"/proc/{d}/cmdline", "rb").read() and \
                    mine in open(f"/proc/{d}/environ", "rb").read().split(b"\0"):
                os.kill(int(d), 9)
        except OSError:
            pass


def run(bed: TestBed, reps: int, log) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpujob-bench-conn-"))
    server = None
    env = None
    gj = gpujob_argv()
    try:
        runtime = tmp / "run"
        runtime.mkdir(mode=0o700)
        idx = tmp / "index"
        build_indexes(idx)
        server, url = serve(idx)
        home = "/root/gj-bench-conn"
        inv = {"hosts": {"tb": {"address": "127.0.0.1", "port": bed.port, "user": "root",
                                "identity_file": str(bed.user_key), "known_hosts": str(bed.known_hosts),
                                "containers": {"ct200": {"vmid": bed.vmid, "home": home}}}}}
        (tmp / "hosts.yaml").write_text(yaml.safe_dump(inv))
        env = dict(os.environ, GPUJOB_HOSTS=str(tmp / "hosts.yaml"), XDG_STATE_HOME=str(tmp / "state"),
                   XDG_RUNTIME_DIR=str(runtime), COLUMNS="120")
        env.pop("GPUJOB_NO_DAEMON", None)
        full_env = dict(env, GPUJOB_NO_DAEMON="1")
        # a second terminal: another ssh-agent socket, so another environment and daemon
        env_b = dict(env, SSH_AUTH_SOCK=str(tmp / "agent-b.sock"))
        log("a short job to ask the status of")
        spec = {"name": "benchconn", "target": "tb/ct200",
                "sync": [{"src": str(REPO / "bench" / "job"), "dest": ".",
                          "exclude": ["__pycache__", "checkpoint.json*"]}],
                "profiles": [{"name": "fast", "index_url": f"{url}/fast/simple",
                              "packages": ["gpujob-demo-kernels==1.0.0+fast"]}],
                "profile": "fast",
                "train": {"command": "python trainer.py --lines 20 --rate 20"}}
        (tmp / "job.yaml").write_text(yaml.safe_dump(spec))
        p = subprocess.run([*gj, "submit", str(tmp / "job.yaml"), "--json"], env=full_env,
                           capture_output=True, cwd=str(REPO))
        if p.returncode != 0:
            raise RuntimeError(f"submit failed: {p.stderr.decode()[-800:]}")
        job = json.loads(p.stdout)["job_id"]
        deadline = time.monotonic() + 300
        while True:
            st = json.loads(subprocess.run([*gj, "status", job, "--json"], env=full_env, capture_output=True,
                                           cwd=str(REPO)).stdout or b"{}")
            if st.get("state") in ("succeeded", "failed", "stopped"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} did not end: {st}")
            time.sleep(1)
        ssh = bed.ssh_argv("pct", "exec", str(bed.vmid), "--", "true")
        cmds = {
            "ssh": (ssh, env),
            "exec_warm": ([*gj, "exec", "tb/ct200", "--", "true"], env),
            "exec_warm_b": ([*gj, "exec", "tb/ct200", "--", "true"], env_b),
            "status_warm": ([*gj, "status", job], env),
            "exec_full": ([*gj, "exec", "tb/ct200", "--", "true"], full_env),
            "status_full": ([*gj, "status", job], full_env),
            "ps_warm": ([*gj, "ps"], env),
            "ps_full": ([*gj, "ps"], full_env),
        }
        samples: dict[str, list[float]] = {k: [] for k in [*cmds, "exec_cold"]}
        log(f"{reps} interleaved repetitions")
        sock, sock_b = sock_of(env), sock_of(env_b)
        if sock == sock_b:
            raise RuntimeError("two environments were given one socket")

        def daemon_up(e: dict = env, path: Path = sock) -> None:
            deadline = time.monotonic() + 60
            while subprocess.run([*gj, "exec", "tb/ct200", "--", "true"], env=e,
                                 capture_output=True).returncode != 0 or not path.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the daemon did not start")
                time.sleep(0.2)
            time.sleep(1)  # let it settle: its start must not land in the next timing

        for k, (argv, e) in cmds.items():  # one untimed round: the daemon starts, caches warm
            timed(argv, e)
        daemon_up()
        daemon_up(env_b, sock_b)
        for _ in range(reps):
            for k, (argv, e) in cmds.items():
                samples[k].append(timed(argv, e))
        for _ in range(max(1, reps // 3)):
            subprocess.run([*gj, "disconnect"], env=env, capture_output=True)
            while sock.exists():
                time.sleep(0.05)
            samples["exec_cold"].append(timed([*gj, "exec", "tb/ct200", "--", "true"], env))
            daemon_up()
        med = {k: statistics.median(v) * 1000 for k, v in samples.items()}
        load = os.getloadavg()
        figs = {
            "exec_warm": {"ours_ms": med["exec_warm"], "baseline_ms": med["ssh"],
                          "ratio": med["ssh"] / med["exec_warm"], "met": med["ssh"] / med["exec_warm"] >= 2},
            "status_warm": {"ours_ms": med["status_warm"], "met": med["status_warm"] <= 150},
            "exec_two_envs": {"ours_ms": max(med["exec_warm"], med["exec_warm_b"]), "baseline_ms": med["ssh"],
                              "ratio": med["ssh"] / max(med["exec_warm"], med["exec_warm_b"]),
                              "met": med["ssh"] / max(med["exec_warm"], med["exec_warm_b"]) >= 2},
        }
        return {"medians_ms": med, "figures": figs, "samples_s": samples, "reps": reps, "job": job,
                "loadavg_at_end": load}
    finally:
        if env is not None:
            subprocess.run([*gj, "disconnect", "--all"], env=env, capture_output=True)
            end_starting(env)
        if server is not None:
            server.shutdown()
        bed.container_exec("rm", "-rf", "/root/gj-bench-conn")
        shutil.rmtree(tmp, ignore_errors=True)


def table(res: dict) -> str:
    m = res["medians_ms"]
    rows = [("`ssh … pct exec 200 -- true` (OpenSSH, new connection)", m["ssh"], "", ""),
            ("`gpujob exec tb/ct200 -- true`, daemon warm", m["exec_warm"],
             f"{m['ssh'] / m['exec_warm']:.2f}× faster than ssh", GOALS["exec_warm"]),
            ("`gpujob exec tb/ct200 -- true`, a second terminal's (own SSH_AUTH_SOCK) daemon warm, "
             "interleaved", m["exec_warm_b"], f"{m['ssh'] / m['exec_warm_b']:.2f}× faster than ssh",
             GOALS["exec_two_envs"]),
            ("`gpujob status JOB`, daemon warm", m["status_warm"], "", GOALS["status_warm"]),
            ("`gpujob exec tb/ct200 -- true`, full CLI (GPUJOB_NO_DAEMON=1)", m["exec_full"],
             f"{m['ssh'] / m['exec_full']:.2f}× ssh", ""),
            ("`gpujob status JOB`, full CLI (GPUJOB_NO_DAEMON=1)", m["status_full"], "", ""),
            ("`gpujob exec tb/ct200 -- true`, no daemon yet (runs directly, starts one)", m["exec_cold"],
             f"{m['ssh'] / m['exec_cold']:.2f}× ssh", ""),
            ("`gpujob ps` (full CLI; its commands over the warm daemon)", m["ps_warm"], "", ""),
            ("`gpujob ps` (full CLI, GPUJOB_NO_DAEMON=1)", m["ps_full"], "", "")]
    out = ["| command | median | against ssh | goal |", "|---|---|---|---|"]
    out += [f"| {a} | {b:.0f} ms | {c} | {d} |" for a, b, c, d in rows]
    f = res["figures"]
    out.append("")
    out.append(f"goals: exec ≥ 2× faster than ssh: {'met' if f['exec_warm']['met'] else 'NOT met'}; "
               f"two environments, each ≥ 2× faster than ssh: "
               f"{'met' if f['exec_two_envs']['met'] else 'NOT met'}; "
               f"status ≤ 150 ms: {'met' if f['status_warm']['met'] else 'NOT met'} "
               f"(load average {res['loadavg_at_end'][0]:.1f} on {os.cpu_count()} CPUs at the end)")
    return "\n".join(out)


def main(argv: list[str] | None = None, *, bed: TestBed | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.conn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 repetitions (no verdicts worth quoting)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    reps = 3 if args.quick else args.reps
    log = lambda m: print(f"[bench.conn] {m}", file=sys.stderr, flush=True)  # noqa: E731
    own = bed is None
    if own:
        log("starting the loopback test bed")
        bed = TestBed.start()
    started = time.time()
    try:
        res = run(bed, reps, log)
    finally:
        if own:
            bed.stop()
    print(table(res))
    if args.json:
        res.update(started=started, seconds=round(time.time() - started, 1), python=platform.python_version(),
                   nproc=os.cpu_count(), uname=platform.uname()._asdict())
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
