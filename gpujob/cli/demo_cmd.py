"""``gpujob demo``: the rollback demo on a target."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpujob.agent.base.protocol import JobState
from gpujob.show import render
from gpujob.errors import InputError, JobError
from gpujob.cli.jobs_cmds import _profile, _start
from gpujob.cli.app import app, ctx, out, _fresh_id, _follow, _print_final, _status


@app.command()
def demo(spec_path: Optional[Path] = typer.Argument(None, metavar="[SPEC]", help="default: the demo "
                                                     "shipped with gpujob (works from any directory)"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         as_json: bool = typer.Option(False, "--json", help="JSON Lines: each act's log lines, its final "
                                      "status, then the rollback that happened")):
    """The offline demo: a profile proves itself, then a slow wheel build is rolled back live."""
    from gpujob.ops.demofiles import build_demo_wheels, work_copy
    from gpujob.spec.model import load_spec
    spec = load_spec(spec_path or work_copy())
    spec_path = spec.source_path if spec_path is None else spec_path
    if spec_path is None:  # load_spec records where it read the spec
        raise TypeError("spec.source_path: not set")
    if isinstance(spec.target, list):  # multi_node
        raise InputError(f"{spec_path}: the demo runs on one container; this spec's target is a list "
                         "(a multi-node job: gpujob submit it)")
    build_demo_wheels(spec)
    t = ctx.target(target or spec.target or "demo")
    good = next(p.name for p in spec.profiles if p.name != spec.profile)
    switched = _profile(spec, None)
    acts = [(good, f"Act 1: the {good} wheel build trains and becomes known-good"),
            (switched, f"Act 2: someone switched to the {switched} build: gpujob notices, "
                           f"rolls back to {good} and resumes from the checkpoint")]
    final = {}
    for profile, title in acts:
        if not as_json:
            render.heading(out, title)
        job_id = _fresh_id(spec.name)
        _start(spec, spec_path, t, profile, job_id, False, quiet=as_json)
        _follow(job_id, t, "job.log", None, as_json=as_json)
        final = _status(job_id, t) if as_json else _print_final(job_id, t)
        if as_json:
            from gpujob.show import jsonl
            jsonl.emit({"act": title, "status": render.status_view(final, t.label)})
        if final.get("state") != JobState.SUCCEEDED:
            raise JobError(f"demo job {job_id} ended {final.get('state')}: {final.get('reason')}")
    rolled = [r for r in final.get("rollbacks") or [] if r.get("signal") != "manual"]
    if not rolled:
        raise JobError("the demo ended without a rollback: the slow build was not caught")
    r = rolled[-1]
    if as_json:
        from gpujob.show import jsonl
        jsonl.emit({"rollback": r})
        return
    render.heading(out, "What happened")
    verdict = ((((final.get("ledger") or {}).get("profiles") or {}).get(r["from"]) or {}).get("status")
               or "untried")
    judged = (f"once {r['to']} had held above the floor for rollback.confirm, it marked {r['from']} bad"
              if verdict == "bad" else
              f"{r['from']} stays {verdict}: the job ended before {r['to']} held for rollback.confirm")
    out.print(render.lit(f"{r['from']} ran below the floor; gpujob decided \"{r['reason']}\", "
              f"had the trainer running on {r['to']} {r['took']:.2f}s later, resumed from its checkpoint, "
              f"and {judged}. "
              f"Try: gpujob status, gpujob logs --events, gpujob ledger history {t.name} {spec.name}"))
