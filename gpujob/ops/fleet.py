"""A multi-node job from the controller (``target:`` a list of containers).

Node 0 is the rendezvous host: torchrun's c10d store listens there
(``{rdzv_endpoint}`` = its address and a port chosen free on it), and its
supervisor leads the others (agent/fleet/nodes.py) over a channel signed with a
per-job key that travels like the job's other secrets (stdin, 0600 file).

All or nothing at the start: every node is submitted in parallel *held* (its
lock taken, its code shipped, its supervisor waiting); only when every node is
held does each get ``go``. One that is busy or unreachable releases the others,
and nothing has started anywhere (no venv, no warmup, no trainer).
"""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from gpujob.ops import plan, ship
from gpujob.ops import submit as submit_op
from gpujob.steps import Step
from gpujob.agent.base import wire
from gpujob.agent.base.placeholders import fleet_env, fleet_values
from gpujob.errors import GpujobError, JobError, RemoteError
from gpujob.spec.model import JobSpec, Nodes
from gpujob.ops.target import Target

ASK = "<node 0's primary IP, asked at submit>"
PORT = "<a port free on node 0, chosen at submit>"


def node_info(spec: JobSpec, labels: list, rank: int, master_addr: str, master_port, channel_port) -> dict:
    """What node ``rank`` is told of the fleet (pure): its place, the rendezvous,
    the leader's channel, the loss policy, its own env (nodes.env)."""
    nodes = spec.nodes or Nodes()  # its defaults are spec.py's
    return {"nnodes": len(labels), "node_rank": rank, "nodes": list(labels),
            "master_addr": master_addr, "master_port": master_port,
            "leader_addr": master_addr, "channel_port": channel_port,
            "on_loss": nodes.on_loss, "lost_after": nodes.lost_after, "start_timeout": nodes.start_timeout,
            "values": fleet_values(len(labels), rank, str(master_addr), master_port),
            "env": dict(nodes.env[rank]) if nodes.env else {}}


def build_plan(spec: JobSpec, targets: list, job_id: str, profile: str,
               resume_from: str | None = None) -> list:
    """[(rank, target, steps)]: every node's steps, each with its own commands."""
    labels = [t.label for t in targets]
    addr = targets[0].address or ASK
    out = []
    for rank, t in enumerate(targets):
        info = node_info(spec, labels, rank, addr, PORT, PORT)
        steps = [Step("fleet", "laptop",
                      f"node {rank} of {len(targets)}: {t.label}; rendezvous at node 0 "
                      f"({addr}:{PORT}); environment "
                      + " ".join(f"{k}={v}" for k, v in {**fleet_env(info["values"]),
                                                         **info["env"]}.items()))]
        if rank == 0:
            steps.append(Step("ports", "container", "choose two free ports (rendezvous, channel) and, "
                              "without hosts.yaml's address, the primary IP",
                              plan.agent_shown(t, "fleet", "ports")))
        steps += plan.build_plan(spec, t, job_id, profile, fleet=info, resume_from=resume_from)
        steps.append(Step("go", "container", "once every node holds its lock: go (else release: "
                          "nothing starts anywhere)", plan.agent_shown(t, "fleet", "go", job_id)))
        out.append((rank, t, steps))
    return out


def _parallel(fn, items: list) -> list:
    """[(item, result or GpujobError)] in order; every call runs."""
    def one(item):
        try:
            return item, fn(item)
        except GpujobError as e:
            return item, e
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(items)))) as pool:
        return list(pool.map(one, items))


def submit(spec: JobSpec, targets: list, *, profile: str, job_id: str, clear_caches: bool,
           progress: Callable[[str], None], resume_from: str | None = None) -> dict:
    """Start the job on every node, or on none; returns {nodes, rendezvous}. ``resume_from``
    (submit --resume-from) is resolved by each node in its own container."""
    labels = [t.label for t in targets]
    ship.sync_sources(spec)  # local problems first, before any node is touched
    lead: Target = targets[0]
    ports = lead.ask(wire.FleetAnswer, "fleet", "ports")
    if not (ports.ports and len(ports.ports) == 2 and ports.address):
        raise RemoteError(f"gpujob agent `fleet ports` on {lead.label} answered no two ports and address")
    master_port, channel_port = ports.ports
    addr = lead.address or ports.address
    where = ("its address: in hosts.yaml (127.0.0.1 by default on a local host)" if lead.address
             else "its primary IP, asked; set address: in hosts.yaml to choose another")
    progress(f"rendezvous on node 0 {lead.label} at {addr}:{master_port} ({where}"
             f"; leader channel port {channel_port})")
    key = secrets.token_hex(32)  # the channel's key: a secret like the spec's (stdin, 0600)

    def start(rank: int) -> wire.SubmitAnswer:
        t = targets[rank]
        info = node_info(spec, labels, rank, addr, master_port, channel_port)
        return submit_op.submit(spec, t, profile=profile, job_id=job_id, clear_caches=clear_caches,
                                progress=lambda m: progress(f"[node {rank}] {m}"), fleet=info, fleet_key=key,
                                resume_from=resume_from)

    results = _parallel(start, list(range(len(targets))))
    failed = [(r, e) for r, e in results if isinstance(e, GpujobError)]
    if failed:
        rank, e = failed[0]
        why = f"node {rank} ({labels[rank]}) could not start: {e.message}"
        released = _parallel(lambda r: targets[r].ask(wire.FleetAnswer, "fleet", "release", job_id,
                                                      "--reason", f"not started: {why}"),
                             [r for r, res in results if not isinstance(res, GpujobError)])
        left = [f"node {r}" for r, res in released if isinstance(res, GpujobError)]
        raise JobError(f"{why}; nothing started on any node" +
                       (f" (could not release {', '.join(left)}: `gpujob stop {job_id}`)" if left else ""),
                       hint=e.hint)
    went = _parallel(lambda r: targets[r].ask(wire.FleetAnswer, "fleet", "go", job_id),
                     list(range(len(targets))))
    bad = [(r, e) for r, e in went if isinstance(e, GpujobError)]
    if bad:
        _parallel(lambda r: targets[r].ask(wire.StopAnswer, "stop", job_id, timeout=600),
                  list(range(len(targets))))
        raise JobError(f"node {bad[0][0]} ({labels[bad[0][0]]}) could not be told to go: "
                       f"{bad[0][1].message}; the job was stopped on every node")
    return {"nodes": [{"rank": r, "target": labels[r], "supervisor_pid": res.supervisor_pid,
                       "stale_lock": res.stale_lock} for r, res in results],
            "rendezvous": f"{addr}:{master_port}",
            "address_source": "hosts.yaml" if lead.address else "asked"}


def statuses(targets: list, job_id: str) -> list:
    """[(rank, target, the agent's status of the job there, or the error)], fetched in parallel."""
    got = _parallel(lambda r: targets[r].ask(wire.StatusAnswer, "status", "--missing-ok", job_id).jobs[0],
                    list(range(len(targets))))
    return [(r, targets[r], st) for r, st in got]


def act_all(targets: list, fn) -> list:
    """Run ``fn(target)`` on every node in parallel: [(rank, result or error)]."""
    return _parallel(lambda r: fn(targets[r]), list(range(len(targets))))
