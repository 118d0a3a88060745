"""One job over several containers (stdlib only): node 0's supervisor leads, the
others follow, over the signed channel of ``channel.py``.

- **Hold**: every node's supervisor is started holding its container lock and waits
  for the controller's ``go`` (sent only once every node's lock is taken), so a busy
  or unreachable node means nothing starts anywhere.
- **Barrier**: a trainer starts only when every node is ready for the same round
  (a round = one start of the trainers on one profile); the leader says ``go``.
- **One decision**: followers report samples, failures and their end; the leader
  runs the policy on the aggregate (``throughput.aggregate``: sum or min of the
  nodes' latest tok/s), and every rollback or restart it decides is a ``relaunch``
  of a new round on one profile: every node stops its trainer, switches to that
  profile and waits at the barrier; all resume together with ``resume_args``.
- **Losses**: a follower silent longer than ``nodes.lost_after`` ends the job
  (``nodes.on_loss: end``) or is waited for (``wait``); a follower keeps its
  trainer running while the leader is away and reconnects to a revived leader.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Protocol

from gpujob.agent.base.stages import Stage
from gpujob.agent.base import defaults
from gpujob.agent.fleet.channel import Client, Server
from gpujob.agent.base.fsio import now
from gpujob.agent.base.protocol import JobState, OutcomeKind
from gpujob.agent.judge.policy import Sample
from gpujob.agent.judge.outcome import Outcome, Stop



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


def make(port: NodePort):
    info = port.job.get("fleet")
    if not info:
        return None
    return (Leader if info["node_rank"] == 0 else Follower)(port, info)


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
                                          "(nodes.start_timeout; the submit was cut off): nothing was started")
                return False
            time.sleep(0.1)

    def set_round(self, r: int) -> None:
        self.round = r
        self.port.journal.set_state(fleet_round=r)


class Leader(Node):
    """Node 0's supervisor: the barrier, the aggregate policy, every decision."""

    def __init__(self, port: NodePort, info):
        super().__init__(port, info)
        tp = defaults.section(port.spec, "throughput")
        self.aggregate = tp["aggregate"] if tp else None  # no throughput watched: nothing to aggregate
        self.server: Server | None = None
        self.heard: dict = {}
        self.ready: dict = {}
        self.latest: dict = {}
        self.failures: list = []
        self.done: set = set()
        self.lost_said: set = set()
        self.last_relaunch: dict | None = port.journal.record().fleet_relaunch

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.server = Server(self.key(), int(self.info["channel_port"]), self.port.job_id)
        self.server.start()
        t = now()
        self.heard = {r: t for r in range(1, self.n)}

    def drain(self) -> list:
        """Take what followers sent; returns the new (rank, sample value) pairs."""
        got = []
        while True:
            try:
                rank, body = self.server.inbox.get_nowait()
            except queue.Empty:
                return got
            if not 0 < rank < self.n:
                continue
            self.heard[rank] = now()
            if body is None:
                self.port.journal.event("fleet_disconnected", rank=rank)
                continue
            kind = body.get("kind")
            if kind == "join":
                self.port.journal.event("fleet_joined", rank=rank, round=body.get("round"),
                                       state=body.get("state"))
                if rank in self.lost_said:
                    self.lost_said.discard(rank)
                    self.port.say(f"{self.label(rank)} is back")
                    if not self.lost_said:
                        self.port.journal.set_state(reason=None)
                if (self.port.journal.record().job_state or JobState.LOST).is_terminal():
                    continue
                if self.last_relaunch and int(body.get("round") or 0) < self.round:
                    self.server.send(rank, self.last_relaunch)  # it missed the decision
            elif kind == "ready":
                self.ready[rank] = int(body.get("round") or 0)
            elif kind == "sample" and int(body.get("round", -1)) == self.round:
                try:
                    got.append((rank, float(body["value"])))
                except (KeyError, TypeError, ValueError):
                    pass
            elif kind == "failed" and int(body.get("round", self.round)) < self.round:
                self.port.journal.event("fleet_stale_failure", rank=rank, reason=body.get("reason"))
            elif kind in ("failed", "ended"):  # a failure of a round already relaunched is old news
                if kind == "ended" and body.get("state") == JobState.SUCCEEDED:
                    self.done.add(rank)
                elif body.get("state") != JobState.STOPPED:
                    self.failures.append((rank, body))
            elif kind == "refused":
                self.port.journal.event("fleet_refused", rank=rank, why=body.get("why"))

    def agg(self):
        if len(self.latest) < self.n:
            return None
        values = list(self.latest.values())
        return sum(values) if self.aggregate == "sum" else min(values)

    def own_sample(self, run, value, step, t):
        self.latest[0] = value
        value = self.agg()
        return None if value is None else self.port.judge_sample(run, value, step, t)

    def fresh_failures(self) -> list:
        """Failures of this round: one of a round already relaunched (a trainer that died
        because its peers were stopped for the relaunch) is old news."""
        self.failures = [(r, b) for r, b in self.failures if int(b.get("round", self.round)) >= self.round]
        return self.failures

    def failure_outcome(self):
        rank, body = self.failures.pop(0)
        failure = body.get("signal") or "node_failed"  # a node that ended: no restart brings it back
        reason = f"{self.label(rank)}: {body.get('reason') or 'failed'}"
        self.port.say(f"{reason} (counts for the whole job)")
        return Outcome(OutcomeKind.SIGNAL, failure, reason, {"node": rank, "tail": body.get("tail") or []},
                       exit_code=body.get("exit_code"))

    def lost_outcome(self, t: float):
        for rank in range(1, self.n):
            if rank in self.done or t - self.heard.get(rank, t) <= self.lost_after:
                continue  # heard lately (a heartbeat a second): not lost, even if just reconnecting
            why = (f"{self.label(rank)} lost: no word from its supervisor for {t - self.heard[rank]:.0f}s "
                   f"(nodes.lost_after {self.lost_after:g}s)")
            if self.on_loss == "end":
                return Outcome(OutcomeKind.SIGNAL, "node_lost", why, {"node": rank})
            if rank not in self.lost_said:
                self.lost_said.add(rank)
                self.port.say(f"{why}; waiting for it (nodes.on_loss: wait)")
                self.port.journal.event("fleet_waiting", rank=rank, why=why)
                self.port.journal.set_state(reason=f"waiting for {self.label(rank)} (nodes.on_loss: wait)")
        return None

    def poll(self, run, t: float):
        """From the watch loop, every 0.2 s: followers' samples, failures, losses."""
        outcome = None
        for rank, value in self.drain():
            self.latest[rank] = value
            agg = self.agg()
            if agg is not None and run.watch_tps and outcome is None:
                outcome = self.port.judge_sample(run, agg, None, t)
        if outcome is None and self.fresh_failures():
            outcome = self.failure_outcome()
        return outcome or self.lost_outcome(t)

    def barrier(self, profile: str):
        """Wait until every follower is ready for this round, then say go."""
        said = False
        while True:
            self.drain()
            if self.fresh_failures():
                return self.failure_outcome()
            out = self.port.requests()
            if out is not None:
                return out
            missing = [r for r in range(1, self.n) if self.ready.get(r) != self.round]
            if not missing:
                self.latest = {}
                self.server.broadcast({"kind": "go", "round": self.round, "profile": profile})
                self.port.journal.event("fleet_barrier", round=self.round, profile=profile)
                self.port.say(f"all {self.n} nodes ready (round {self.round}, profile {profile}): go")
                return None
            out = self.lost_outcome(now())
            if out is not None:
                return out
            if not said:
                said = True
                self.port.say(f"waiting at the barrier for {', '.join(self.label(r) for r in missing)}")
            time.sleep(0.05)

    def handle(self, out, profile):
        if out.kind == OutcomeKind.SIGNAL and "returncode" in out.evidence and "node" not in out.evidence:
            # our own trainer exited by itself: a peer's failure that caused it is the better reason
            end = now() + 2.0
            while now() < end and not self.fresh_failures():
                self.drain()
                time.sleep(0.05)
            if self.fresh_failures():
                peer = self.failure_outcome()
                out.reason = f"{peer.reason}; here: {out.reason}"
            else:
                gone = [r for r in range(1, self.n) if r not in self.server.connected() and r not in self.done]
                if gone:  # a node whose supervisor died with its trainer says nothing: say it for it
                    out.reason = (f"{out.reason}; {', '.join(self.label(r) for r in gone)} unreachable "
                                  "(its supervisor is gone)")
        return None

    def decided(self, out, profile: str, restarts_before: int) -> None:
        """After a decision that goes on: a rollback or restart is one relaunch of every node."""
        st = self.port.journal.state()
        if st.get("step") == "rollback" and st.get("pending_rollback"):
            to, reason = st["pending_rollback"]["to"], st["pending_rollback"]["reason"]
        elif len(self.port.restarts) > restarts_before or (out.kind == OutcomeKind.SIGNAL and st.get("step") == "train"):
            to, reason = st.get("profile") or profile, f"restart on {profile}: {out.reason}"
        else:
            return
        msg = {"kind": "relaunch", "round": self.round + 1, "profile": to, "reason": reason}
        self.set_round(self.round + 1)
        self.last_relaunch = msg
        self.port.journal.set_state(fleet_relaunch=msg)
        self.server.broadcast(msg)
        self.port.journal.event("fleet_relaunch", **{k: v for k, v in msg.items() if k != "kind"})
        what = f"restart on {to}" if to == profile else f"switch to {to}"
        self.port.say(f"every node: stop, {what}, resume together (round {self.round})")

    def ended(self, state: str, reason: str) -> None:
        if self.server is None:
            return
        self.server.broadcast({"kind": "end", "state": state, "reason": reason})
        time.sleep(0.2)
        self.server.close()


class Follower(Node):
    """Another node's supervisor: reports to the leader, acts on its word."""

    def __init__(self, port: NodePort, info):
        super().__init__(port, info)
        self.client: Client | None = None
        self.last_heard = now()  # the leader beats every second
        self.away_said = False
        self.ready_msg: dict | None = None

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        st = self.port.journal.state()
        self.client = Client(self.key(), self.info["leader_addr"], int(self.info["channel_port"]),
                             self.port.job_id, self.rank, {"round": self.round, "state": st.get("state")})
        self.client.start()
        self.last_heard = now()

    def leader_gone_for(self, t: float) -> float:
        return t - self.last_heard

    def drain(self):
        """The leader's word: an Outcome to act on (relaunch, end), or None."""
        while True:
            try:
                body = self.client.inbox.get_nowait()
            except queue.Empty:
                return None
            kind = body.get("kind")
            if kind != "disconnected":
                self.last_heard = now()
            if kind == "connected":
                if self.away_said:
                    self.away_said = False
                    self.port.say("leader reachable again")
                if self.ready_msg:
                    self.client.send(self.ready_msg)
                self.client.hello["round"] = self.round
            elif kind == "relaunch" and int(body.get("round") or 0) > self.round:
                self.set_round(int(body["round"]))
                self.client.hello["round"] = self.round
                self.ready_msg = None
                return Outcome(OutcomeKind.ROLLBACK, "fleet", f"node 0 decided: {body.get('reason')}",
                               to=body.get("profile"), mark_bad=False)
            elif kind == "end":
                return Outcome(OutcomeKind.FLEET_END, body.get("state") or "failed",
                               f"node 0: {body.get('reason') or 'ended'}")
            elif kind == "go" and int(body.get("round") or 0) == self.round:
                return Outcome(OutcomeKind.FLEET_GO)

    def own_sample(self, run, value, step, t):
        self.client.send({"kind": "sample", "value": value, "step": step, "round": self.round})
        run.samples.append(Sample(t, value, step))
        del run.samples[:-1000]
        self.port.journal.sample(t=round(t, 3), value=value, step=step, verdict="reported",
                                profile=run.profile)
        if t - run.last_state > 1.0:
            run.last_state = t
            values = [s.value for s in run.samples[-120:]]
            self.port.journal.set_state(tps=value, tps_recent=values, verdict="reported to node 0")
        return None

    def poll(self, run, t: float):
        out = self.drain()
        if out is not None and out.kind != OutcomeKind.FLEET_GO:
            return out
        if not self.away_said and self.leader_gone_for(t) > 3.0:
            self.away_said = True
            self.port.say(f"leader {self.label(0)} unreachable; the trainer keeps running, reconnecting")
        return None

    def wait_word(self, why: str):
        """Wait for the leader's decision (a relaunch or the end); give up when it is
        unreachable longer than nodes.lost_after."""
        while True:
            out = self.drain()
            if out is not None:
                return out
            req = self.port.requests()
            if req is not None and req.kind == OutcomeKind.STOP:
                return req
            if self.leader_gone_for(now()) > self.lost_after:
                return Outcome(OutcomeKind.FLEET_END, "failed", f"{why}; leader {self.label(0)} unreachable for "
                               f"{self.leader_gone_for(now()):.0f}s (nodes.lost_after {self.lost_after:g}s)")
            time.sleep(0.05)

    def barrier(self, profile: str):
        self.ready_msg = {"kind": "ready", "round": self.round, "profile": profile}
        self.client.send(self.ready_msg)
        self.port.say(f"ready (round {self.round}, profile {profile}); waiting for node 0's go")
        out = self.wait_word("waiting at the barrier")
        if out.kind == OutcomeKind.FLEET_GO:
            self.ready_msg = None
            return None
        return out

    def handle(self, out, profile):
        """How a follower acts on an outcome: True/False as Supervisor.handle, None: as usual."""
        while True:
            if out.kind == OutcomeKind.FLEET_END:
                self.port.finish(out.signal_name, out.reason)
                return True
            if out.kind == OutcomeKind.ROLLBACK and out.signal_name == "fleet":
                if out.to == profile:
                    self.port.journal.set_state(step=Stage.TRAIN, resume=True)
                    self.port.say(f"restart on {profile}: {out.reason}")
                else:
                    self.port.plan_rollback(profile, out.to, out, "fleet", mark_bad=False)
                return False
            if out.kind != OutcomeKind.SIGNAL:
                return None
            body = {"kind": "failed", "signal": out.signal_name, "reason": out.reason, "round": self.round,
                    "exit_code": out.exit_code, "tail": list((out.evidence or {}).get("tail") or [])[-5:]}
            self.client.send(body)
            self.port.journal.event("fleet_failure_reported", signal=out.signal_name, reason=out.reason)
            self.port.say(f"reported to node 0: {out.reason}; waiting for its decision")
            self.ready_msg = None
            nxt = self.wait_word(out.reason)
            while nxt.kind == OutcomeKind.FLEET_GO:  # a go of a round we already left
                nxt = self.wait_word(out.reason)
            if nxt.kind == OutcomeKind.STOP:
                raise Stop()
            out = nxt

    def decided(self, out, profile: str, restarts_before: int) -> None:
        return None

    def ended(self, state: str, reason: str) -> None:
        if self.client is None:
            return
        self.client.send({"kind": "ended", "state": state, "reason": reason})
        time.sleep(0.1)
        self.client.close()
