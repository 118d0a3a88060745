"""Every node but node 0 of a multi-node job (stdlib only): it reports its samples,
failures and end to the leader, waits at the barrier for its word, and keeps its trainer
running while the leader is away (agent/fleet/nodes.py)."""

from __future__ import annotations

import queue
import time

from gpujob.agent.base.stages import Stage
from gpujob.agent.fleet.channel import Client
from gpujob.agent.base.fsio import now
from gpujob.agent.base.protocol import OutcomeKind
from gpujob.agent.judge.policy import Sample
from gpujob.agent.judge.outcome import Outcome, Stop
from gpujob.agent.fleet.node import Node, NodePort


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

    def channel(self) -> Client:
        """The channel to the leader: start() opened it, and every use comes after."""
        assert self.client is not None, "the follower's channel is used before start()"
        return self.client

    def drain(self):
        """The leader's word: an Outcome to act on (relaunch, end), or None."""
        while True:
            try:
                body = self.channel().inbox.get_nowait()
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
                    self.channel().send(self.ready_msg)
                self.channel().hello["round"] = self.round
            elif kind == "relaunch" and int(body.get("round") or 0) > self.round:
                self.set_round(int(body["round"]))
                self.channel().hello["round"] = self.round
                self.ready_msg = None
                return Outcome(OutcomeKind.ROLLBACK, "fleet", f"node 0 decided: {body.get('reason')}",
                               to=body.get("profile"), mark_bad=False)
            elif kind == "end":
                return Outcome(OutcomeKind.FLEET_END, body.get("state") or "failed",
                               f"node 0: {body.get('reason') or 'ended'}")
            elif kind == "go" and int(body.get("round") or 0) == self.round:
                return Outcome(OutcomeKind.FLEET_GO)

    def own_sample(self, run, value, step, t):
        self.channel().send({"kind": "sample", "value": value, "step": step, "round": self.round})
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
                return Outcome(OutcomeKind.FLEET_END, "failed",
                               f"{why}; leader {self.label(0)} unreachable for "
                               f"{self.leader_gone_for(now()):.0f}s (nodes.lost_after {self.lost_after:g}s)")
            time.sleep(0.05)

    def barrier(self, profile: str):
        self.ready_msg = {"kind": "ready", "round": self.round, "profile": profile}
        self.channel().send(self.ready_msg)
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
            self.channel().send(body)
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
