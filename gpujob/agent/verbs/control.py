"""The agent's ``stop`` and ``rollback``: requests to a job's supervisor, or, when
it is gone, the same end carried out by the agent itself."""

from __future__ import annotations

import os
import time

from gpujob.agent.base.stages import Stage
from gpujob.agent.base.protocol import ENDED, FINAL_STATES
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.home.ledger import Ledger
from gpujob.agent.base.fsio import now
from gpujob.agent.home.lock import Lock
from gpujob.agent.judge.decide import pick
from gpujob.agent.base.protocol import JobState
from gpujob.agent.base.proc import kill_group
from gpujob.agent.home.trim import read_jsonl_from
from gpujob.agent.base.wire import Code, Refused, RollbackAnswer, StopAnswer
from gpujob.agent.verbs.lifecycle import (acquire, emit, job_or_refuse, live_processes, revive,
                                          spawn_supervisor)


def wait_final(j: Journal, timeout: float) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        st = j.effective_state()
        if st.get("state") in ENDED:
            return st
        time.sleep(0.1)
    return j.effective_state()


def end_leftovers(home: Home, job_id: str, final: dict) -> tuple:
    """A job with no supervisor: end what it left running (its phase command's
    whole process group) and write its final state. Returns (state, survivors)."""
    held = Lock(home.root).try_acquire(job_id)  # so that nobody revives it meanwhile
    try:
        j = Journal(home, job_id, held.generation if held else None)
        st = j.state()
        child = st.get("child") or {}
        pgid = child.get("pgid") or st.get("child_pgid")
        left = kill_group(int(pgid), 10, first=5.0) if pgid else []  # quietly: the command first
        j.set_state(child=None, finished_at=now(), **final)
        j.event("state", state=final.get("state"), reason=final.get("reason"))
        for name, _req in j.pending():  # carried out here (a stop), or nobody is left to act on it
            j.done(name)
        return j.effective_state(), left
    finally:
        if held:
            held.release()


def supersede(j: Journal) -> list:
    """A command by hand runs the job again (``rollback`` of a lost or ended job): a new
    run, and the stops queued for the earlier one (their supervisor died before acting
    on them) are dropped, each with its event; returns what was dropped. ``j`` holds the
    lock: no supervisor reads the queue meanwhile."""
    run = j.state().get("run")
    new = (run if isinstance(run, int) else 0) + 1
    j.set_state(run=new)
    why = "asked of an earlier run, whose supervisor died before acting on it; `rollback` ran the job again"
    return [j.drop_request(name, req, why) for name, req in j.pending()
            if req.get("kind") == "stop" and not (isinstance(req.get("run"), int) and req["run"] >= new)]


def cmd_stop(home: Home, args) -> None:
    j = job_or_refuse(home, args.job)
    st = j.effective_state()
    if st.get("state") in FINAL_STATES:
        emit(StopAnswer(args.job, st["state"], already=True))
        return
    waits: list = []
    if st.get("state") != JobState.LOST:
        try:
            mark = os.path.getsize(j.path("events.jsonl"))
        except OSError:
            mark = 0
        j.request("stop")  # stays queued until the job has ended: a stop always wins
        st = wait_final(j, args.wait)
        waits = [{k: e.get(k) for k in ("waited", "finished", "left")}
                 for e in read_jsonl_from(j.path("events.jsonl"), mark) if e.get("type") == "save_waited"]
    left = []
    if st.get("state") == JobState.LOST:  # no supervisor to ask: stop what it left ourselves
        st, left = end_leftovers(home, args.job, {"state": JobState.STOPPED, "phase": "done",
                                                  "reason": "stopped by hand after its supervisor was lost"})
    emit(StopAnswer(args.job, st.get("state"), left=left or live_processes(st),
                    save_waited=waits[-1] if waits else None))


def cmd_rollback(home: Home, args) -> None:
    j = job_or_refuse(home, args.job)
    st = j.effective_state()
    job = j.job()
    if (job.get("fleet") or {}).get("node_rank"):  # one decision for every node: node 0's
        raise Refused(f"job {args.job} is node {job['fleet']['node_rank']} of a multi-node job: "
                      "roll it back through node 0, whose supervisor leads", Code.CONFLICT)
    profiles = [p["name"] for p in job["spec"]["profiles"]]
    if args.to and args.to not in profiles:
        raise Refused(f"no profile {args.to!r} in job {args.job}; profiles: {', '.join(profiles)}",
                      Code.BAD_REQUEST)
    pending = st.get("pending_rollback")
    current = st.get("profile") or job["profile"]  # the profile that ran last (a switch not done: its 'from')
    if pending and args.to in (None, pending["to"]) and st.get("state") not in ENDED:
        emit(RollbackAnswer(args.job, pending["from"], pending["to"], requested=True, already=True))
        return
    if args.to == current and not pending:
        raise Refused(f"job {args.job} already runs on profile {current}", Code.CONFLICT)
    reason = args.reason or "rolled back by hand"
    target = args.to or pick(
        Ledger(home, job["spec"]["name"]).read(), current, profiles,
        (job["spec"].get("rollback") or {}).get("fallback"))
    if target is None:
        raise Refused(f"no known-good profile other than {current}; name one with --to", Code.CONFLICT)
    dropped: list = []
    if st.get("state") == JobState.LOST and st.get("lost_reason") is None:
        # a supervisor again, which finishes what the last one began; a stop queued for the
        # dead one is superseded by this rollback before the new one can read it
        revive(home, args.job, before=lambda fenced: dropped.extend(supersede(fenced)))
        st = j.effective_state()
    if st.get("state") not in ENDED:
        j.request("rollback", to=target, reason=reason, mark_bad=bool(args.mark_bad))
        emit(RollbackAnswer(args.job, current, target, requested=True, dropped_stops=dropped or None))
        return
    held, _stale = acquire(home, args.job)
    try:
        jj = Journal(home, args.job, held.generation)
        if j.supervisor_alive(st, starting=False):  # an ended job's supervisor, sending its last
            kill_group(int(st["supervisor_pid"]), 5)  # messages: the new one takes its outbox over
        pgid = (st.get("child") or {}).get("pgid") or st.get("child_pgid")
        if pgid:
            kill_group(int(pgid), 10)  # never two trainers on the same GPUs
        dropped = supersede(jj)
        jj.set_state(state=JobState.ROLLING_BACK, phase="env", step=Stage.ROLLBACK, reason=reason,
                     finished_at=None, child=None, lost_reason=None, revivals=[],
                     pending_rollback={"from": current, "to": target, "reason": reason, "signal": "manual",
                                       "decided_at": now(), "mark_bad": bool(args.mark_bad), "request": None})
        pid = spawn_supervisor(home, args.job, held)
    except BaseException:
        held.release()
        raise
    # an ended job runs again: the CLI says so
    emit(RollbackAnswer(args.job, current, target, restarted=True, supervisor_pid=pid,
                        was=st.get("state"), dropped_stops=dropped or None))
