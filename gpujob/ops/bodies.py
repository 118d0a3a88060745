"""The bodies of the commands the kept connection serves (``exec``, ``status``, ``ps``),
shared by the full CLI and the daemon so both print the same bytes.

``ctx`` is anything with ``state()`` and ``target(name)`` (the CLI's Ctx, or the
daemon's per-request one); ``out``/``err`` are rich consoles; ``so``/``se`` binary
sinks for a command's raw output.
"""

from __future__ import annotations

import json
from typing import Optional

from gpujob.agent.base import wire
from gpujob.agent.base.protocol import JobState
from gpujob.errors import GpujobError, InputError

#: ``ps`` asks this many hosts at once (over their kept connections, or new ones), and
#: waits this long for their answers (``--timeout``)
PS_WORKERS = 64
PS_TIMEOUT = 20.0


def run_exec(t, argv: list[str], stdin, timeout: Optional[float], so, se, err) -> int:
    """``gpujob exec`` (without --json): run argv in the container, output streamed; its exit code."""
    r = t.run(argv, stdin=stdin, timeout=timeout,
              on_stdout=lambda b: (so.write(b), so.flush()), on_stderr=lambda b: (se.write(b), se.flush()))
    say_timed_out(r, timeout, t, err)
    return r.exit_code


def say_timed_out(r, timeout: Optional[float], t, err) -> None:
    if r.timed_out:
        err.print(f"gpujob: timed out after {timeout:g}s; the command was ended in {t.name}")


def job_target(ctx, job: Optional[str], target: Optional[str]):
    """(job id, target) of a job this laptop knows, or of JOB on --target."""
    if target:
        if job is None:
            raise InputError("with --target, name the job too")
        return job, ctx.target(target)
    row = ctx.state().job(job)
    return row["job_id"], ctx.target(row["target"])


def multi_node(ctx, job: Optional[str]) -> bool:
    """Whether the laptop's index has JOB (or the most recent job) as a multi-node job
    (``status`` shows those with gpujob/cli/fleet_cmds.py)."""
    try:
        row = ctx.state().job(job)
    except GpujobError:
        return False
    return bool(ctx.state().nodes(row["job_id"]))


def fetch_status(ctx, job_id: str, t, err) -> dict:
    st = t.ask(wire.StatusAnswer, "status", job_id).jobs[0]
    say_revived(st, err)
    ctx.state().seen(job_id, st.get("state"), st.get("ledger"), t.label, st.get("name"))
    return st


def say_revived(st: dict, err) -> None:
    r = st.get("revived")
    if not r:
        return
    if r.get("revived"):
        what = "it re-adopted the running command" if r.get("readopted") else "it carries on from the journal"
        err.print(f"note: the supervisor of {st.get('job_id')} (pid {r.get('previous_pid')}) was gone; "
                  f"restarted its supervisor (pid {r.get('supervisor_pid')}): {what}", markup=False)
    else:
        err.print(f"warning: the supervisor of {st.get('job_id')} is gone and was not restarted: "
                  f"{r.get('why')}", markup=False)


def show_status(ctx, job_id: str, t, as_json: bool, out, err) -> None:
    """``gpujob status``: state, phase, profile, tok/s with its trend and threshold, rollbacks."""
    from gpujob.show import plainjson, render  # (rich: exec's body, above, is run without it on a cold start)
    st = fetch_status(ctx, job_id, t, err)
    if as_json:
        plainjson.print_json(out, json.dumps(render.status_view(st, t.label)))
    else:
        render.print_status(out, render.status_view(st, t.label))


def ps_rows(ctx, target: Optional[str], limit: int) -> list:
    """The jobs ``gpujob ps`` shows: this laptop's most recent (or TARGET's), newest first."""
    rows = ctx.state().jobs(limit if target is None else 1000)
    if target is not None:
        label = ctx.target(target).label
        rows = [r for r in rows if r["target"] == label][:limit]
    return rows


def show_ps(ctx, rows: list, as_json: bool, timeout: float, workers: int, out, err) -> None:
    """``gpujob ps``: every row's state fetched from its container, the targets asked at
    once (gpujob/ops/fanout.py); a target that fails or gives no answer in ``timeout``
    is said once and its jobs shown unreachable."""
    from gpujob.ops import fanout
    from gpujob.show import plainjson, render
    by_target: dict[str, list[str]] = {}
    for r in rows:
        by_target.setdefault(r["target"], []).append(r["job_id"])

    opened: dict = {}

    def fetch(target: str) -> dict:
        t = opened[target] = ctx.target(target)
        return by_job(t.ask(wire.StatusAnswer, "status", "--missing-ok", *by_target[target]))

    def cancel(target: str) -> None:  # given up on: its connection closed, so its thread ends
        t = opened.get(target)
        if t is not None:
            for tr in (t.host_transport, t.transport):  # the connection first: it never waits
                if tr is not None:
                    tr.close()

    def begin(target: str):  # sent now on an open exec channel (the daemon's), or None: fetch
        t = opened[target] = ctx.target(target)
        return t.agent_begin("status", "--missing-ok", *by_target[target])

    def end(target: str, begun, until: float):
        answer = opened[target].ask_end(wire.StatusAnswer, begun, until)
        return fanout.FETCH if answer is None else by_job(answer)  # None: its agent is shipped first

    def by_job(answer: wire.StatusAnswer) -> dict:
        return answer.by_id()

    states = {}
    answers = fanout.gather(list(by_target), fetch, workers=workers, deadline=timeout, begin=begin, end=end,
                            cancel=cancel)
    for target, res in answers.items():  # in the order of the rows
        if isinstance(res, (GpujobError, fanout.NoAnswer)):
            why = res.message if isinstance(res, GpujobError) else str(res)
            n = len(by_target[target])
            err.print(f"gpujob: {target} is unreachable ({why}); its {n} job{'s' if n > 1 else ''} "
                      f"shown as unreachable", markup=False, highlight=False)
            res = {j: {"state": "unreachable", "reason": why} for j in by_target[target]}
        elif isinstance(res, BaseException):
            raise res
        states.update(res)
    views = []
    seen = {}
    for r in rows:
        st = states.get(r["job_id"], {})
        if r["state"] == "submitting" and st.get("state") == JobState.NOT_FOUND:
            gone = ctx.state().abandoned(r)
            if gone is None:  # a submit going on now (another shell): it is not there yet
                going = dict(st, job_id=r["job_id"], state="submitting")
                views.append(render.status_view(going, r["target"]))
                continue
            ctx.state().unreserve(r["job_id"])  # a phantom: its submit was killed before the container had it
            err.print(f"gpujob: {r['job_id']} was never started: its submit (gpujob pid {gone}) ended before "
                      f"{r['target']} had the job; forgotten", markup=False, highlight=False)
            continue
        if st.get("state") != "unreachable":
            seen[r["job_id"]] = st.get("state")
        views.append(render.status_view(dict(st, job_id=r["job_id"]), r["target"]))
    ctx.state().seen_states(seen)  # one commit, not one a row
    if as_json:
        plainjson.print_json(out, json.dumps(views))
        return
    out.print(render.ps_table(views))
