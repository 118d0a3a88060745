"""The CLI's multi-node half: submit (plan), status with a row per node, logs
interleaved with a ``[node i]`` prefix, stop and rollback on every node. main.py
hands a job here when the laptop's index records its nodes (or its spec's
``target`` is a list)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from gpujob.agent.base import wire
from gpujob.ops import fleet
from gpujob.agent.judge.throughput import fmt_rate
from gpujob.show import render
from gpujob.errors import GpujobError, InputError


def _m():
    from gpujob.cli import app
    return app


def targets_of(labels: list) -> list:
    return [_m().ctx.target(label) for label in labels]


def submit(spec, spec_path: Path, *, target: Optional[str], profile: str, plan: bool, follow: bool,
           clear: bool, job_id: Optional[str], as_json: bool, force: bool = False,
           resume_from: Optional[str] = None) -> None:
    """One job over the spec's containers. ``resume_from`` (submit --resume-from JOB|PATH) is
    resolved by each node in its own container: JOB's newest finished checkpoint there (a job of
    several nodes left one per node), or PATH; a node that has none refuses, and nothing starts."""
    m = _m()
    from gpujob.ops.plan import new_job_id
    if target:
        raise InputError("--target: the spec's target is a list of containers (a multi-node job); "
                         "edit it there")
    targets = []
    for i, name in enumerate(spec.target):
        try:
            targets.append(m.ctx.target(name))
        except InputError as e:
            from gpujob.errors import SpecError
            raise SpecError(str(spec_path), spec.line_of(("target", i)), f"target[{i}]", e.message) from None
    job_id = job_id or (new_job_id(spec.name) if plan else m._fresh_id(spec.name))
    if plan:
        for rank, t, steps in fleet.build_plan(spec, targets, job_id, profile, resume_from=resume_from):
            for line in render.plan_lines(f" node {rank} of {len(targets)}: {spec_path} → {t.label} "
                                          f"({t.transport.describe()}), job {job_id}, profile {profile}; "
                                          "nothing runs", steps):
                m.out.print(line, soft_wrap=True)
        return
    from gpujob.spec.model import spec_hash
    from gpujob.agent.base.planshare import ledger_name
    labels = [t.label for t in targets]
    if not force:  # the fleet's ledger (per shape) as node 0 has it; nothing changes when refused
        name = ledger_name({"spec": {"name": spec.name}, "fleet": {"nnodes": len(labels), "nodes": labels}})
        from gpujob.errors import JobError
        try:
            led = targets[0].ask(wire.LedgerAnswer, "ledger", "show", name).ledger or {}
        except JobError as e:  # a damaged ledger: nothing starts until it is recovered (or --force)
            raise JobError(f"{e.message}; or start without it: submit --force") from None
        entry = (led.get("profiles") or {}).get(profile) or {}
        if entry.get("status") == "bad":
            raise JobError(render.bad_profile_refusal(profile, name, f"{len(labels)} nodes", entry,
                                                      targets[0].name))
    state = m.ctx.state()
    state.reserve(job_id, spec.name, labels[0], str(spec_path.resolve()), spec_hash(spec), profile)
    state.set_nodes(job_id, labels)
    try:
        res = fleet.submit(spec, targets, profile=profile, job_id=job_id, clear_caches=clear,
                           progress=lambda msg: m.err.print(render.lit(f"· {msg}", "dim")),
                           resume_from=resume_from)
    except GpujobError as e:
        if e.exit_code in (2, 5):  # refused, or bad input: nothing started anywhere
            state.unreserve(job_id)
        else:
            state.seen(job_id, "unknown")
        raise
    state.seen(job_id, "preparing")
    if as_json:
        m.out.print_json(json.dumps(dict(res, job_id=job_id)))
        return
    m.out.print(render.styled("submitted ", (job_id, "bold"),
                              f" to {len(targets)} nodes: {', '.join(labels)} (profile {profile}, "
                              f"rendezvous {res['rendezvous']})"))
    if follow:
        logs(job_id, labels, follow=True, node=None, file="job.log", tail=None)
        views = node_views(job_id, labels)
        print_views(job_id, views)
        raise typer.Exit(0 if views[0]["state"] == "succeeded" else 1)
    m.out.print(f"follow it: gpujob logs -f {job_id}    status: gpujob status {job_id}")


def node_views(job_id: str, labels: list) -> list:
    m = _m()
    views = []
    for rank, t, st in fleet.statuses(targets_of(labels), job_id):
        if isinstance(st, GpujobError):
            st = {"state": "unreachable", "reason": st.message}
        else:
            m._say_revived(st)
        v = render.status_view(dict(st, job_id=job_id), t.label)
        v.update(node=rank, host=t.host_name, container=t.name)
        views.append(v)
    lead = views[0]
    m.ctx.state().seen(job_id, lead["state"])
    return views


def print_views(job_id: str, views: list) -> None:
    m = _m()
    render.print_status(m.out, dict(views[0],
                                    target=f"{len(views)} nodes (node 0 leads: {views[0]['target']})"))
    table = Table(title=f"nodes of {job_id}", title_justify="left", show_edge=False)
    for col in ("node", "host", "container", "state", "profile", "tok/s", "reason"):
        table.add_column(col)
    for v in views:
        table.add_row(str(v["node"]), render.lit(v["host"]), render.lit(v["container"]),
                      render.lit(v["state"] or "?"), render.lit(v["profile"] or "-"),
                      fmt_rate(v["tok_s"]) if v["tok_s"] is not None else "-",
                      render.lit((v["reason"] or "")[:120]))
    m.out.print(table)


def status(job_id: str, labels: list, as_json: bool) -> None:
    views = node_views(job_id, labels)
    if as_json:
        _m().out.print_json(json.dumps({"job": job_id, "state": views[0]["state"], "nodes": views}))
        return
    print_views(job_id, views)


def logs(job_id: str, labels: list, *, follow: bool, node: Optional[int], file: str, tail: Optional[int],
         events: bool = False, as_json: bool = False) -> None:
    """Every node's log, each line prefixed ``[node i]`` (interleaved as they come
    with -f), or one node's as it is (``--node i``)."""
    m = _m()
    from gpujob.ops.follow import follow_log
    if node is not None and not 0 <= node < len(labels):
        raise InputError(f"--node: expected 0 to {len(labels) - 1}, got {node}")
    if node is not None:
        m._follow(job_id, m.ctx.target(labels[node]), file, tail, follow=follow, events=events,
                  as_json=as_json)
        return
    so = sys.stdout.buffer
    lock = threading.Lock()
    errors: list = []

    def one(rank: int) -> None:
        buf = bytearray()
        prefix = f"[node {rank}] ".encode()

        def write(chunk: bytes) -> None:
            buf.extend(chunk)
            *lines, rest = bytes(buf).split(b"\n")
            buf[:] = rest
            if lines:
                with lock:
                    so.write(b"".join(prefix + ln + b"\n" for ln in lines))
                    so.flush()
        try:
            follow_log(m.ctx.target(labels[rank]), job_id, file=file, follow=follow, last=tail,
                       write=write,
                       notice=lambda msg: m.err.print(render.lit(f"gpujob: [node {rank}] {msg}")))
        except GpujobError as e:
            errors.append(f"node {rank}: {e.message}")
        if buf:
            with lock:
                so.write(prefix + bytes(buf) + b"\n")
                so.flush()

    if not follow:
        for rank in range(len(labels)):
            one(rank)
    else:
        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(len(labels))]
        for th in threads:
            th.start()
        for th in threads:
            while th.is_alive():
                th.join(0.2)
    for e in errors:
        m.err.print(render.lit(f"gpujob: {e}"))
    if errors:
        raise typer.Exit(1)


def stop(job_id: str, labels: list, as_json: bool) -> None:
    m = _m()
    # node 0 first: its supervisor ends every node as stopped. Stopping the followers at the same
    # time would let the leader see a peer's trainer end before its own stop and call it a failure.
    targets = targets_of(labels)
    def stop_one(t) -> dict:
        return t.ask(wire.StopAnswer, "stop", job_id, timeout=600).to_dict()
    got = fleet.act_all(targets[:1], stop_one)
    got += [(r + 1, res) for r, res in fleet.act_all(targets[1:], stop_one)]
    rows = [{"node": r, "target": labels[r], **(res if not isinstance(res, GpujobError) else
                                                 {"state": "unreachable", "error": res.message})}
            for r, res in got]
    if rows[0].get("state"):
        m.ctx.state().seen(job_id, rows[0]["state"])
    if as_json:
        m.out.print_json(json.dumps({"job_id": job_id, "nodes": rows}))
    for row in rows:
        if not as_json:
            m.out.print(render.lit(f"{job_id} node {row['node']} ({row['target']}): {row.get('state')}"
                                   + (f" ({row['error']})" if row.get("error") else "")))
    if any(row.get("left") or row.get("error") for row in rows):
        raise typer.Exit(1)


def rollback(job_id: str, labels: list, to: Optional[str], mark_bad: bool, as_json: bool) -> None:
    """Asked of node 0, whose supervisor decides for every node: all stop, switch, resume together."""
    m = _m()
    t = m.ctx.target(labels[0])
    res = t.ask(wire.RollbackAnswer, "rollback", job_id, *(["--to", to] if to else []),
                *(["--mark-bad"] if mark_bad else []), timeout=120)
    if as_json:
        m.out.print_json(json.dumps(dict(res.to_dict(), mark_bad=mark_bad, nodes=labels)))
        return
    m.out.print(render.rollback_line(job_id, res, mark_bad))
    for line in render.dropped_stop_lines(job_id, res):
        m.out.print(line)
    m.out.print(render.lit(f"node 0 ({labels[0]}) relaunches all {len(labels)} nodes on that profile "
                           f"together"))


def nodes_of(job: Optional[str], target: Optional[str]) -> tuple:
    """(job id, its node labels) when the laptop's index says the job is multi-node, else (None, [])."""
    if target:
        return None, []
    m = _m()
    try:
        row = m.ctx.state().job(job)
    except GpujobError:
        return None, []
    labels = m.ctx.state().nodes(row["job_id"])
    return (row["job_id"], labels) if labels else (None, [])
