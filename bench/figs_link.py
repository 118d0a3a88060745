"""The figures of the way in: container commands over the one connection (and where a
command's time goes), a whole ``gpujob exec`` process as users run it (warm, cold, without
the daemon; the CLI's start-up), and ``gpujob ps`` over 4 hosts."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time

from bench.harness import CLK_TCK, FINAL, Harness
from bench.report import Figure, median


def cpu_busy() -> float:
    """CPU seconds this machine has spent busy (all cores, /proc/stat) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def commands(h: Harness) -> None:
    n, t = h.sizes.commands, h.target
    if not t.run(["true"]).ok:  # the one connection is open (and its first channel done)
        raise RuntimeError("`true` failed in the container")
    base_argv = h.ssh_pct("true")
    ours, base = [], []
    for _ in range(h.sizes.reps):
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
    h.add(Figure("commands", f"{n} container commands (per command)", "ms",
                    "≥ 10× faster and ≤ 33 ms", o, b, b / o, b / o >= 10 and o <= 33,
                    {"ours_ms": ours, "baseline_ms": base, "breakdown_ms": command_breakdown(h)},
                    "ours: Target.run(['true']) over one SSH connection (a channel + pct exec each); "
                    "baseline: a new `ssh … pct exec 200 -- true` each"))


def command_breakdown(h: Harness, n: int = 10) -> dict:
    """Where one container command's time goes (ms each, median of n): the pieces of
    `pct exec` over an open connection, each run on its own."""
    def ms(fn) -> float:
        xs = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            xs.append((time.perf_counter() - t0) * 1000)
        return round(median(xs), 2)

    host = h.target.host_transport
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
        "pct_exec_true_on_host_no_ssh": ms(lambda: run([str(h.bed.bin_dir / "pct"), "exec",
                                                        str(h.bed.vmid), "--", "true"])),
        "lxc_attach_true": ms(lambda: h.bed.container_exec("true")),
    }


def exec_cli(h: Harness) -> None:
    """``gpujob exec`` in the default configuration (console script, kept connection,
    warm and cold) and without the daemon, each against one ``ssh … pct exec``; and
    the CLI's start-up (``--version``, ``--help``)."""
    argv = ["exec", "tb/ct200", "--", "true"]
    runs: dict = {"warm": [], "cold": [], "no_daemon": [], "ssh": [], "version": [], "help": []}
    h.user_cli(argv)  # the daemon is up and its connection open
    for _ in range(h.sizes.reps):
        runs["warm"].append(h.user_cli(argv))
        t0 = time.perf_counter()
        subprocess.run(h.ssh_pct("true"), stdin=subprocess.DEVNULL, check=True)
        runs["ssh"].append(time.perf_counter() - t0)
        h.user_cli(["disconnect"], check=False)
        runs["cold"].append(h.user_cli(argv))
        runs["no_daemon"].append(h.user_cli(argv, daemon=False))
        runs["version"].append(h.user_cli(["--version"]))
        runs["help"].append(h.user_cli(["--help"]))
    m = {k: median(v) for k, v in runs.items()}
    b = m["ssh"]
    common = {f"{k}_s": v for k, v in runs.items()}
    for key, what, mode, target, ok in (
            ("exec_cli", "warm, kept connection (default)", "warm", "≥ 2× faster", lambda r: r >= 2),
            ("exec_cli_cold", "cold: first call, daemon started", "cold", "within 1.5× (≥ 0.67×)",
             lambda r: r >= 1 / 1.5),
            ("exec_cli_nodaemon", "GPUJOB_NO_DAEMON=1", "no_daemon", "—", None)):
        r = b / m[mode]
        h.add(Figure(key, f"one `gpujob exec tb/ct200 -- true`, {what}", "ms", target,
                        m[mode] * 1000, b * 1000, r, ok(r) if ok else None, common,
                        "the installed console script as a fresh process, against one "
                        "`ssh … pct exec 200 -- true`"))
    h.add(Figure("startup_version", "`gpujob --version` (console script)", "ms", "≤ 150 ms",
                    m["version"] * 1000, None, None, m["version"] <= 0.150, common))
    h.add(Figure("startup_help", "`gpujob --help` (console script)", "ms", "≤ 400 ms",
                    m["help"] * 1000, None, None, m["help"] <= 0.400, common))


def status4(h: Harness) -> None:
    import gpujob.cli.jobs_cmds as cm  # ps, and the out and PS_WORKERS it uses
    from rich.console import Console

    from gpujob.ops.state import State
    done = [j for j in h.job_ids if h.state(j).get("state") in FINAL]
    if len(done) < 4:  # run on its own (--only status4): make a few short jobs to ask about
        spec = h.write_spec("short.yaml", profile="fast", trainer="--lines 5 --rate 50")
        for _ in range(4 - len(done)):
            job, _ = h.submit(spec)
            h.wait_final(job)
            done.append(job)
    state_home = h.tmp / "state-ps"
    db = State(state_home / "gpujob" / "state.db")
    hosts = h.bed.host_names[:4]
    for job, host in zip(done[-4:], hosts):
        db.reserve(job, "bench", f"{host}/ct{h.bed.vmid}", "", "", "fast")
    db.close()
    saved = {k: os.environ.get(k) for k in ("GPUJOB_HOSTS", "XDG_STATE_HOME")}
    os.environ.update(GPUJOB_HOSTS=str(h.hosts), XDG_STATE_HOME=str(state_home))
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
        for _ in range(h.sizes.status_reps):
            ours.append(ps(True))
            base.append(ps(False))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    o, b = median(ours), median(base)
    h.add(Figure("status4", "`gpujob ps` over 4 hosts (4 sshd's)", "s", "≥ 3× faster",
                    o, b, b / o, b / o >= 3,
                    {"parallel_s": ours, "sequential_s": base,
                     "cpu": {k: {m: round(median([u[m] for u in v]), 3) for m in v[0]}
                             for k, v in use.items()}},
                    "the ps command's code in-process, new SSH connections each run (as a fresh CLI); "
                    "baseline: the same code with its thread pool cut to one worker"))


def ps_kept(h: Harness) -> None:
    from bench import psfan
    psfan.run(h, Figure, median, FINAL)


def ps_cli(h: Harness) -> None:
    from bench import psfan
    psfan.cli_figures(h, Figure, median, FINAL)
