"""``gpujob ps`` over many hosts (issue 25).

As users run it (the installed console script, a fresh process each time; ``ps`` is
served by the kept connection's daemon, which asks every host at once over the
connections it holds):

ps_cli           ps over jobs on the bed's 4 hosts (4 sshd's), warm (the daemon up and
                 its 4 connections open) / the one-by-one baseline: 4 ``ssh … pct exec 200
                 -- python3 … agent status JOB``, one after another (what a user types
                 without gpujob)
ps_cli_cold      the same, the first call (no daemon yet: the full CLI runs it and
                 starts one) / the same baseline
ps_cli_nodaemon  the same with GPUJOB_NO_DAEMON=1 (new connections, asked at once)
ps50             ps over 50 inventory entries that all reach the bed's first sshd and its
                 container (the daemon holding 50 SSH connections and exec channels, one
                 ``agent status`` each) / ps over 1 of them through its own warm daemon;
                 the target is "within 2×"

And ps's code in this process over one kept ``Targets`` (what the daemon runs):

ps4_kept  ps over jobs on the bed's 4 hosts / the same with ``PS_WORKERS`` cut to 1
          (hosts one after another): on loopback there is no round trip to overlap, so
          this measures the client's cost a host
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import time


def _ps(cm, Console, timeout: float | None = None) -> tuple[float, list]:
    sink = io.StringIO()
    real = cm.out
    cm.out = Console(file=sink, width=200, highlight=False)
    try:
        t0 = time.perf_counter()
        cm.ps(target=None, all_=False, as_json=True, limit=100, timeout=timeout or cm.PS_TIMEOUT)
        took = time.perf_counter() - t0
    finally:
        cm.out = real
    return took, json.loads(sink.getvalue())


def hosts50(bench, path) -> list[str]:
    """An inventory of 50 hosts h01..h50, each the bed's first sshd with container 200."""
    bed = bench.bed
    lines = ["hosts:"]
    names = [f"h{i:02d}" for i in range(1, 51)]
    for name in names:
        lines += [f"  {name}:", "    address: 127.0.0.1", f"    port: {bed.ports[0]}", "    user: root",
                  f"    identity_file: {json.dumps(str(bed.user_key))}",
                  f"    known_hosts: {json.dumps(str(bed.known_hosts))}",
                  "    containers:", f"      ct{bed.vmid}: {{vmid: {bed.vmid}}}"]
    path.write_text("\n".join(lines) + "\n")
    return names


def run(bench, Figure, median, FINAL) -> None:
    import gpujob.cli.jobs_cmds as cm
    from rich.console import Console

    from gpujob.ops.state import State
    vmid = bench.bed.vmid
    saved = {k: os.environ.get(k) for k in ("GPUJOB_HOSTS", "XDG_STATE_HOME")}
    real_workers = cm.PS_WORKERS

    real_target = type(cm.ctx).target
    opened: dict = {}

    def kept_target(self, name):  # as the daemon's Entry.target: one Target (and exec channel) a label
        if name not in opened:
            opened[name] = real_target(self, name)
        return opened[name]

    def use(hosts_file, state_home):
        for t in opened.values():
            t.transport.close()
        opened.clear()
        cm.ctx.close()
        cm.ctx.hosts, cm.ctx._targets, cm.ctx._state = None, None, None
        os.environ.update(GPUJOB_HOSTS=str(hosts_file), XDG_STATE_HOME=str(state_home))

    type(cm.ctx).target = kept_target

    try:
        # ---- 4 hosts, kept connections: in parallel / one after another
        done = [j for j in bench.job_ids if bench.state(j).get("state") in FINAL][-4:]
        home4 = bench.tmp / "state-ps4k"
        db = State(home4 / "gpujob" / "state.db")
        for i, host in enumerate(bench.bed.host_names[:4]):
            db.reserve(done[i] if i < len(done) else f"bench-ps4-{i}", "bench", f"{host}/ct{vmid}", "", "",
                       "fast")
        db.close()
        use(bench.hosts, home4)
        _ps(cm, Console, 120)  # connections and exec channels opened: kept from here on
        par, seq = [], []
        for _ in range(bench.sizes.status_reps):
            cm.PS_WORKERS = real_workers
            t, views = _ps(cm, Console)
            par.append(t)
            cm.PS_WORKERS = 1
            seq.append(_ps(cm, Console)[0])
            cm.PS_WORKERS = real_workers
            if len({v["target"] for v in views if v["state"] != "unreachable"}) != 4:
                raise RuntimeError(f"ps did not reach 4 hosts: {views}")
        o, b = median(par), median(seq)
        bench.add(Figure("ps4_kept", "`gpujob ps` over 4 hosts, kept connections", "s", "≥ 3× faster",
                         o, b, b / o, b / o >= 3, {"parallel_s": par, "sequential_s": seq},
                         "ps's code in-process over one kept Targets (each host's SSH connection and exec "
                         "channel opened once, before timing); baseline: the same with PS_WORKERS = 1"))
    finally:
        type(cm.ctx).target = real_target
        for t in opened.values():
            t.transport.close()
        cm.PS_WORKERS = real_workers
        cm.ctx.close()
        cm.ctx.hosts, cm.ctx._targets, cm.ctx._state = None, None, None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _views(raw: bytes, n: int) -> list:
    views = json.loads(raw)
    if len(views) != n or any(v["state"] == "unreachable" for v in views):
        raise RuntimeError(f"ps did not reach its {n} jobs: {views[:3]}")
    return views


def warm(bench, argv: list, env: dict) -> float:
    """Until a ps is served warm: the first call with no daemon runs the full CLI and starts
    one (in the background: it has by the time the ~1 s CLI ends), the second opens that
    daemon's connections (kept from then on). The seconds that second call took."""
    bench.user_cli(argv, env=env)
    first = bench.user_cli(argv, env=env)
    bench.user_cli(argv, env=env)  # (had the daemon not answered the second yet)
    return first


def cli_figures(bench, Figure, median, FINAL) -> None:
    """ps_cli, ps_cli_cold, ps_cli_nodaemon and ps50: the console script as users run it."""
    from gpujob.ops.state import State
    bed, vmid = bench.bed, bench.bed.vmid
    done = [j for j in bench.job_ids if bench.state(j).get("state") in FINAL][-4:]
    home4 = bench.tmp / "state-pscli"
    db = State(home4 / "gpujob" / "state.db")
    jobs = []
    for i, (host, port) in enumerate(zip(bed.host_names[:4], bed.ports[:4])):
        job = done[i] if i < len(done) else f"bench-pscli-{i}"
        db.reserve(job, "bench", f"{host}/ct{vmid}", "", "", "fast")
        jobs.append((job, port))
    db.close()
    env4 = {"XDG_STATE_HOME": str(home4)}
    argv = ["ps", "--json"]
    t = bench.target
    manual = [bed.ssh_argv(shlex.join(["pct", "exec", str(vmid), "--",
                                        *t.agent_argv("status", "--missing-ok", job)]), port=port)
              for job, port in jobs]
    runs: dict = {"warm": [], "cold": [], "no_daemon": [], "one_by_one": []}
    got: list = []
    warm(bench, argv, env4)
    for _ in range(bench.sizes.status_reps):
        got.clear()
        runs["warm"].append(bench.user_cli(argv, env=env4, stdout=got))
        t0 = time.perf_counter()
        for cmd in manual:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
            if p.returncode != 0 or b'"jobs"' not in p.stdout:
                raise RuntimeError(f"the manual status failed: {p.stderr[-500:]!r}")
        runs["one_by_one"].append(time.perf_counter() - t0)
        bench.user_cli(["disconnect"], check=False, env=env4)
        runs["cold"].append(bench.user_cli(argv, env=env4, stdout=got))
        runs["no_daemon"].append(bench.user_cli(argv, daemon=False, env=env4, stdout=got))
        for raw in got:
            _views(raw, 4)
        warm(bench, argv, env4)  # warm again for the next round (the daemon the cold call started)
    m = {k: median(v) for k, v in runs.items()}
    b = m["one_by_one"]
    common = {f"{k}_s": v for k, v in runs.items()}
    note = ("`gpujob ps --json`, the installed console script as a fresh process, over jobs on the bed's "
            "4 hosts; baseline: 4 `ssh … pct exec 200 -- python3 … agent status JOB`, one after another")
    for key, what, mode, target, ok in (
            ("ps_cli", "warm, kept connection (default)", "warm", "≥ 3× faster", lambda r: r >= 3),
            ("ps_cli_cold", "cold: first call, daemon started", "cold", "—", None),
            ("ps_cli_nodaemon", "GPUJOB_NO_DAEMON=1", "no_daemon", "—", None)):
        r = b / m[mode]
        bench.add(Figure(key, f"`gpujob ps` over 4 hosts, {what}", "s", target, m[mode], b, r,
                         ok(r) if ok else None, common, note))
    # ---- 50 inventory entries on the one loopback sshd / 1 of them, each through its daemon
    names = hosts50(bench, bench.tmp / "hosts50.yaml")
    envs = {}
    for n in (1, 50):
        home = bench.tmp / f"state-ps50-{n}"
        db = State(home / "gpujob" / "state.db")
        for i, host in enumerate(names[:n]):
            db.reserve(f"bench-ps50-{n}-{i:02d}", "bench", f"{host}/ct{vmid}", "", "", "fast")
        db.close()
        envs[n] = {"GPUJOB_HOSTS": str(bench.tmp / "hosts50.yaml"), "XDG_STATE_HOME": str(home)}
    argv = ["ps", "--json", "--limit", "100"]  # (20 rows by default)
    first = {}
    for n in (1, 50):
        first[n] = warm(bench, argv + ["--timeout", "300"], envs[n])
    over: dict = {1: [], 50: []}
    for _ in range(bench.sizes.status_reps):
        for n in (1, 50):
            got.clear()
            over[n].append(bench.user_cli(argv, env=envs[n], stdout=got))
            _views(got[0], n)
    for n in (1, 50):
        bench.user_cli(["disconnect"], check=False, env=envs[n])
    o, b = median(over[50]), median(over[1])
    bench.add(Figure("ps50", "`gpujob ps` over 50 hosts (one loopback sshd) vs over 1", "s",
                     "within 2× of over 1", o, b, b / o, o <= 2 * b,
                     {"over_50_s": over[50], "over_1_s": over[1],
                      "first_over_50_s": round(first[50], 3), "first_over_1_s": round(first[1], 3)},
                     "`gpujob ps --json`, the console script, its daemon holding 50 SSH connections and exec "
                     "channels (50 inventory entries, all the bed's first sshd and container 200), one agent "
                     "status each; baseline: ps over 1 of them through its own warm daemon (ratio: over-1 / "
                     "over-50)"))
