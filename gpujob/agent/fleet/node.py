"""What both kinds of node share (stdlib only): the port back to the supervisor
(``NodePort``) and ``Node``: the controller's go, the round, the channel's key
(agent/fleet/nodes.py says how a multi-node job runs)."""

from __future__ import annotations

import time
from typing import Any, Protocol

from gpujob.agent.base.fsio import now


class NodePort(Protocol):
    """What a node asks of its supervisor, the port back to it (supervisor.py's FleetPort):
    a leader's aggregate sample is judged by the watch's ``judge_sample``."""

    job_id: str
    job: dict  # job.json
    spec: dict
    journal: Any

    @property
    def stop_asked(self) -> bool: ...
    @property
    def restarts(self) -> list: ...
    def secrets(self) -> dict: ...
    def say(self, text: str) -> None: ...
    def set_state(self, state, durable: bool = True, **kw) -> None: ...
    def finish(self, state, reason: str, **kw) -> None: ...
    def plan_rollback(self, frm: str, to: str, out, failure: str, mark_bad: bool,
                      suspect: dict | None = None) -> None: ...
    def requests(self): ...
    def judge_sample(self, run, value: float, step, t: float): ...


class Node:
    def __init__(self, port: NodePort, info: dict):
        self.port, self.info = port, info
        self.rank, self.n = int(info["node_rank"]), int(info["nnodes"])
        self.labels = list(info["nodes"])
        self.lost_after = float(info["lost_after"])  # the controller sends spec.py's defaults
        self.on_loss = info["on_loss"]
        self.round = int(port.journal.record().fleet_round or 0)
        self.started = False

    def label(self, rank: int) -> str:
        return f"node {rank} ({self.labels[rank]})"

    def key(self) -> bytes:
        key = self.port.secrets().get("fleet_key")
        if not key:
            from gpujob.agent.judge.outcome import EnvError
            raise EnvError("the job's fleet key is missing from its secrets (it ended, or was not "
                           "submitted by a multi-node submit)")
        return bytes.fromhex(key)

    # ---- the controller's go ---------------------------------------------
    def wait_go(self) -> bool:
        """Hold until the controller says go (every node's lock is taken). False: the
        job ended meanwhile (a stop: another node was busy)."""
        j = self.port.journal
        if j.record().fleet_go:
            return True
        self.port.set_state("preparing", phase="hold", reason="waiting until every node's lock is taken")
        since = now()
        while True:
            for name, req in j.pending():
                if req["kind"] == "go":
                    j.set_state(fleet_go=True, reason=None)
                    j.done(name)
                    j.event("fleet_go", nnodes=self.n, rank=self.rank)
                    return True
                if req["kind"] == "stop":
                    self.port.finish("stopped", req.get("reason") or "stopped before it started")
                    return False
            if self.port.stop_asked:
                self.port.finish("stopped", "stopped before it started")
                return False
            limit = float(self.info["start_timeout"])
            if now() - since > limit:  # the controller died between the holds and the go
                self.port.finish("failed", f"the controller never said go within {limit:g}s "
                                          "(nodes.start_timeout; the submit was cut off): nothing was "
                                          "started")
                return False
            time.sleep(0.1)

    def set_round(self, r: int) -> None:
        self.round = r
        self.port.journal.set_state(fleet_round=r)
