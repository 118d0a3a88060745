"""The bodies of the commands the kept connection serves (``exec``, ``status``),
shared by the full CLI and the daemon so both print the same bytes.

``ctx`` is anything with ``state()`` and ``target(name)`` (the CLI's Ctx, or the
daemon's per-request one); ``out``/``err`` are rich consoles; ``so``/``se`` binary
sinks for a command's raw output.
"""

from __future__ import annotations

import json
from typing import Optional

from gpujob.errors import GpujobError, InputError


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
    st = t.agent_json("status", job_id)["jobs"][0]
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
        err.print(f"warning: the supervisor of {st.get('job_id')} is gone and was not restarted: {r.get('why')}",
                  markup=False)


def show_status(ctx, job_id: str, t, as_json: bool, out, err) -> None:
    """``gpujob status``: state, phase, profile, tok/s with its trend and threshold, rollbacks."""
    from gpujob.cli import plainjson, render  # (rich: exec's body, above, is run without it on a cold start)
    st = fetch_status(ctx, job_id, t, err)
    if as_json:
        plainjson.print_json(out, json.dumps(render.status_view(st, t.label)))
    else:
        render.print_status(out, render.status_view(st, t.label))
