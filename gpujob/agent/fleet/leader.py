"""Node 0 of a multi-node job (stdlib only): it serves the channel, gathers the followers'
samples, failures and ends, runs the policy on the aggregate and sends every round's go
and every relaunch (agent/fleet/nodes.py)."""

from __future__ import annotations

import queue
import time

from gpujob.agent.base import defaults
from gpujob.agent.fleet.channel import Server
from gpujob.agent.base.fsio import now
from gpujob.agent.base.protocol import JobState, OutcomeKind
from gpujob.agent.judge.outcome import Outcome
from gpujob.agent.fleet.node import Node, NodePort


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

    def channel(self) -> Server:
        """The followers' channel: start() opened it, and every use comes after."""
        assert self.server is not None, "the leader's channel is used before start()"
        return self.server

    def drain(self) -> list:
        """Take what followers sent; returns the new (rank, sample value) pairs."""
        got: list = []
        while True:
            try:
                rank, body = self.channel().inbox.get_nowait()
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
                    self.channel().send(rank, self.last_relaunch)  # it missed the decision
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
                self.channel().broadcast({"kind": "go", "round": self.round, "profile": profile})
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
                up = self.channel().connected()
                gone = [r for r in range(1, self.n) if r not in up and r not in self.done]
                if gone:  # a node whose supervisor died with its trainer says nothing: say it for it
                    out.reason = (f"{out.reason}; {', '.join(self.label(r) for r in gone)} unreachable "
                                  "(its supervisor is gone)")
        return None

    def decided(self, out, profile: str, restarts_before: int) -> None:
        """After a decision that goes on: a rollback or restart is one relaunch of every node."""
        st = self.port.journal.state()
        if st.get("step") == "rollback" and st.get("pending_rollback"):
            to, reason = st["pending_rollback"]["to"], st["pending_rollback"]["reason"]
        elif len(self.port.restarts) > restarts_before or (out.kind == OutcomeKind.SIGNAL
                                                           and st.get("step") == "train"):
            to, reason = st.get("profile") or profile, f"restart on {profile}: {out.reason}"
        else:
            return
        msg = {"kind": "relaunch", "round": self.round + 1, "profile": to, "reason": reason}
        self.set_round(self.round + 1)
        self.last_relaunch = msg
        self.port.journal.set_state(fleet_relaunch=msg)
        self.channel().broadcast(msg)
        self.port.journal.event("fleet_relaunch", **{k: v for k, v in msg.items() if k != "kind"})
        what = f"restart on {to}" if to == profile else f"switch to {to}"
        self.port.say(f"every node: stop, {what}, resume together (round {self.round})")

    def ended(self, state: str, reason: str) -> None:
        if self.server is None:
            return
        self.server.broadcast({"kind": "end", "state": state, "reason": reason})
        time.sleep(0.2)
        self.server.close()
