"""``gpujob ps`` over kept connections (issue 25): the figures ``ps4_kept`` and ``ps50``.

Both run ps's code in this process with one ``Targets`` and one ``Target`` per label
kept across runs (what the kept connection's daemon holds for a user, its
``Entry.target``: each host's SSH connection and its exec channel into the container,
opened once and warmed before timing).

ps4_kept  ps over jobs on the bed's 4 hosts (4 sshd's) / the same with ``PS_WORKERS``
          cut to 1 (hosts one after another)
ps50      ps over 50 inventory entries that all reach the bed's first sshd and its
          container (50 SSH connections, 50 exec channels, one ``agent status`` each) /
          ps over 1 of them; the target is "within 2×"
"""

from __future__ import annotations

import io
import json
import os
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

    from gpujob.state import State
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
            db.reserve(done[i] if i < len(done) else f"bench-ps4-{i}", "bench", f"{host}/ct{vmid}", "", "", "fast")
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
        # ---- 50 host entries on the one loopback sshd / 1 of them
        names = hosts50(bench, bench.tmp / "hosts50.yaml")
        homes = {}
        for n in (1, 50):
            homes[n] = bench.tmp / f"state-ps50-{n}"
            db = State(homes[n] / "gpujob" / "state.db")
            for i, host in enumerate(names[:n]):
                db.reserve(f"bench-ps50-{n}-{i:02d}", "bench", f"{host}/ct{vmid}", "", "", "fast")
            db.close()
        use(bench.tmp / "hosts50.yaml", homes[50])
        t_open = time.perf_counter()
        _ps(cm, Console, 300)  # 50 connections opened (kept)
        t_open = time.perf_counter() - t_open
        keep = cm.ctx._targets
        one, fifty = [], []
        for _ in range(bench.sizes.status_reps):
            for n, out in ((1, one), (50, fifty)):
                os.environ["XDG_STATE_HOME"] = str(homes[n])
                cm.ctx._state = None
                cm.ctx._targets = keep
                t, views = _ps(cm, Console)
                if len(views) != n or any(v["state"] == "unreachable" for v in views):
                    raise RuntimeError(f"ps over {n}: {views[:3]}")
                out.append(t)
        o, b = median(fifty), median(one)
        bench.add(Figure("ps50", "`gpujob ps` over 50 hosts (one loopback sshd) vs over 1", "s",
                         "within 2× of over 1", o, b, b / o, o <= 2 * b,
                         {"over_50_s": fifty, "over_1_s": one, "first_over_50_s": round(t_open, 3)},
                         "ps's code in-process over one kept Targets holding 50 SSH connections (50 "
                         "inventory entries, all the bed's first sshd and container 200), one agent status "
                         "each; baseline: ps over 1 of them (ratio: over-1 / over-50)"))
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
