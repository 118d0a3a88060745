"""``gpujob bisect`` and ``gpujob tune``: which of a profile's changes made it slow, and
which profile is fastest, measured on the job's own trainer (ops/bisect.py runs them)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from gpujob.show import render
from gpujob.cli.app import _fresh_id, app, ctx, err, out
from gpujob.agent.base import wire
from gpujob.agent.base.protocol import JobState
from gpujob.errors import ConnectError, InputError, JobError, SpecError

TRIAL_TIME = typer.Option("10m", "--trial-time", metavar="DURATION",
                          help="longest a trial trains (it ends sooner once its steady rate is known)")
START = typer.Option(None, "--from", metavar="JOB", help="start each trial from a copy of this job's newest "
                     "finished checkpoint (in the trial's own workdir); default: from scratch")
SLOWER = typer.Option(0.9, "--slower", min=0.05, max=0.99,
                      help="a trial is slow below this fraction of the good profile's steady rate")


def _check_start(spec, start: Optional[str]) -> None:
    import re
    if start is None:
        return
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", start):
        raise InputError(f"--from: expected a job id (lowercase letters, digits and '-'), got {start[:70]!r}")
    if spec.train.checkpoint is None:
        raise InputError(f"--from: needs train.checkpoint in {spec.source_path} (path and every): gpujob "
                         f"finds the job's newest finished checkpoint through it")


def _setup(spec_path: Path, target: Optional[str], sets):
    from gpujob.spec.model import load_spec
    spec = load_spec(spec_path, sets or [])
    if isinstance(spec.target, list):
        raise InputError("bisect and tune run on one container; this spec names several (a multi-node job)")
    name = target or spec.target
    if not name:
        raise SpecError(str(spec_path), 1, "target", "missing (required), or pass --target")
    from gpujob.ops import bisect as ops
    ops.check_scratch(spec)
    return spec, ctx.target(name), ops.policy_of(spec)


def _duration(text: str) -> float:
    from gpujob.spec.types import _duration as parse
    try:
        return parse(text)
    except ValueError as e:
        raise InputError(f"--trial-time: {e}") from None


def _trials(spec, spec_path: Path, t, cfg, trial_time: float, slower: float, quiet: bool,
            start: Optional[str] = None):
    from gpujob.ops import bisect as ops
    from gpujob.ops import submit as submit_op
    from gpujob.spec.model import spec_hash
    from gpujob.show import bisect as show
    count = {"n": 0}
    last: dict = {}

    def submit(tspec) -> str:
        job_id = _fresh_id(tspec.name)
        state = ctx.state()  # recorded as submit records a job: `gpujob logs/status ID` reach a trial
        state.reserve(job_id, tspec.name, t.label, str(spec_path.resolve()), spec_hash(tspec),
                      tspec.profile, entry=ctx.entry(t))
        try:
            submit_op.submit(tspec, t, profile=tspec.profile, job_id=job_id, clear_caches=False,
                        progress=lambda m: None, resume_from=start, resume_copy=True)
        except (InputError, JobError, ConnectError):  # refused (container busy) or never reached
            state.unreserve(job_id)
            raise
        except BaseException:  # cut off mid-submit: the trial may run there; its timeout ends it
            state.seen(job_id, JobState.UNKNOWN)
            raise
        state.seen(job_id, JobState.PREPARING)
        return job_id

    def progress(tr, word: str) -> None:
        if word == "submitting":
            count["n"] += 1
        now = time.monotonic()
        key = (tr.label, word)
        if quiet or (last.get("key") == key and now - last.get("at", 0) < 5 and word != "done"):
            return
        last.update(key=key, at=now)
        err.print(render.lit(f"· {show.progress_line(count['n'], tr, word)}", "dim"), soft_wrap=True)
    return ops.Trials(t, cfg, trial_time=trial_time, slower=slower, progress=progress, submit=submit)


def _ledger(t, name: str) -> dict:
    return t.ask(wire.LedgerAnswer, "ledger", "show", name).ledger or {}


def _defaults(spec, t, good: Optional[str], bad: Optional[str]) -> tuple:
    """--good: the ledger's known-good; --bad: the profile it marked bad last."""
    led = _ledger(t, spec.name) if good is None or bad is None else {}
    profs = led.get("profiles") or {}
    if good is None:
        good = led.get("last_good")
        if not good:
            raise InputError(f"--good: the ledger of {spec.name} on {t.label} has no known-good profile; "
                             f"name one")
    if bad is None:
        bads = sorted(((e.get("at") or 0, p) for p, e in profs.items() if e.get("status") == "bad"),
                      reverse=True)
        if not bads:
            raise InputError(f"--bad: the ledger of {spec.name} on {t.label} marks no profile bad; name one")
        bad = bads[0][1]
    names = [p.name for p in spec.profiles]
    for opt, value in (("--good", good), ("--bad", bad)):
        if value not in names:
            raise InputError(f"{opt}: profile {value!r} is not in {spec.source_path} (its profiles: "
                             f"{', '.join(names)}); bisect needs its packages and index")
    if good == bad:
        raise InputError(f"--good and --bad are the same profile ({good})")
    return good, bad


def _plan(spec, t, header: str, trials: list) -> None:
    """Each trial's steps as submit --plan shows them (env build, warmup, train)."""
    from gpujob.ops.plan import build_plan
    out.print(render.lit(header), soft_wrap=True)
    for label, tspec in trials:
        out.print(render.lit(f"trial {label}: job {tspec.name}-xxxx, profile {tspec.profile}, workdir "
                             f"{t.home}/work/{tspec.name} (its own; rollback off, no webhooks)"),
                  soft_wrap=True)
        steps = [s for s in build_plan(spec=tspec, target=t, job_id=f"{tspec.name}-xxxx",
                                            profile=tspec.profile) if s.kind in ("env", "warmup", "train")]
        for line in render.plan_lines("", steps)[1:]:
            out.print(line, soft_wrap=True)


@app.command()
def bisect(spec_path: Path = typer.Argument(..., metavar="SPEC"),
           good: Optional[str] = typer.Option(None, "--good", help="the good profile (default: the ledger's "
                                              "known-good)"),
           bad: Optional[str] = typer.Option(None, "--bad", help="the slow profile (default: the one the "
                                             "ledger marked bad last)"),
           target: Optional[str] = typer.Option(None, "--target", "-t"),
           together: Optional[list[str]] = typer.Option(None, "--together", metavar="PKG,PKG",
                                                        help="packages that move together (repeatable)"),
           trial_time: str = TRIAL_TIME, slower: float = SLOWER, start: Optional[str] = START,
           apply: bool = typer.Option(False, "--apply", help="record the answer as the bad profile's reason "
                                      "in the ledger (gpujob ledger history shows it)"),
           plan: bool = typer.Option(False, "--plan", help="print the difference and what each trial runs"),
           as_json: bool = typer.Option(False, "--json"),
           sets: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE")):
    """Which of the changes from a good profile to a slow one makes it slow: trials of the good set
    with subsets of the changes, on the job's own trainer, in a scratch job of their own."""
    from gpujob.ops import bisect as ops
    from gpujob.agent.judge import bisect as core
    from gpujob.show import bisect as show
    spec, t, cfg = _setup(spec_path, target, sets)
    seconds = _duration(trial_time)
    _check_start(spec, start)
    good, bad = _defaults(spec, t, good, bad)
    tied = [set(x.strip() for x in s.split(",") if x.strip()) for s in together or []]
    gp, bp = spec.profile_by_name(good), spec.profile_by_name(bad)
    g, b = core.resolved(gp.model_dump()), core.resolved(bp.model_dump())
    groups = core.difference(g, b, tied)
    if not groups:
        raise InputError(f"profiles {good} and {bad} hold the same packages and env: nothing to bisect")
    if plan:
        first = next(core.search(len(groups)))
        res = core.apply(g, [groups[i] for i in sorted(first)])
        out.print(render.lit(f"bisect {good} -> {bad}: {len(groups)} changes; one culprit takes at most "
                             f"{core.single_bound(len(groups))} trials, the good one's included"),
                  soft_wrap=True)
        for line in show.difference_lines(groups):
            out.print(render.lit(line), soft_wrap=True)
        second = ops.trial_profile(gp, bp, res, ops.set_name(res))
        _plan(spec, t, f"each trial trains at most {seconds:g}s (less once its steady rate is known); "
                       "nothing runs", [("1 (the good profile)", ops.trial_spec(spec, gp, seconds)),
                                        (f"2 ({core.describe([groups[i] for i in sorted(first)])})",
                                         ops.trial_spec(spec, second, seconds))])
        out.print(render.lit("then one trial a subset, each chosen from the verdicts so far"), soft_wrap=True)
        return
    trials = _trials(spec, spec_path, t, cfg, seconds, slower, as_json, start)
    result = ops.bisect(spec, good, bad, trials, together=tied)
    sentence = result.sentence()
    recorded = None
    if apply and result.answer.culprit:
        recorded = t.ask(wire.LedgerAnswer, "ledger", "set", spec.name, bad, "bad",
                         f"--reason=bisect: {sentence}")
    if as_json:
        out.print_json(json.dumps({
            "good": good, "bad": bad, "changes": [core.describe([g_]) for g_ in result.groups],
            "culprit": [core.describe([g_]) for g_ in core.culprit_groups(result.groups, result.answer)],
            "merged": [list(m) for m in result.answer.merged], "answer": sentence,
            "trials": [tr.view() for tr in [result.good, *result.trials]],
            "seconds": round(result.seconds, 1), "recorded": bool(recorded)}))
        return
    for line in show.trial_lines(result):
        out.print(render.lit(line), soft_wrap=True)
    out.print(render.lit(sentence, "bold"), soft_wrap=True)
    if recorded:
        out.print(render.lit(f"recorded in the ledger of {spec.name} on {t.label}: {bad} is bad "
                             "(gpujob ledger history shows why)"), soft_wrap=True)


@app.command()
def tune(spec_path: Path = typer.Argument(..., metavar="SPEC"),
         profiles: list[str] = typer.Option(..., "--profile", "-p",
                                            help="a profile to measure (repeat: 2 or more)"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         trial_time: str = TRIAL_TIME, start: Optional[str] = START,
         apply: bool = typer.Option(False, "--apply", help="make the winner known-good in the ledger, "
                                    "with every profile's measured rate as the reason"),
         plan: bool = typer.Option(False, "--plan", help="print what each trial runs"),
         as_json: bool = typer.Option(False, "--json"),
         sets: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE")):
    """Rank profiles by their steady tok/s on the job's own trainer, each from the same start."""
    from gpujob.ops import bisect as ops
    from gpujob.show import bisect as show
    spec, t, cfg = _setup(spec_path, target, sets)
    seconds = _duration(trial_time)
    _check_start(spec, start)
    names = list(dict.fromkeys(profiles))
    known = [p.name for p in spec.profiles]
    for n in names:
        if n not in known:
            raise InputError(f"--profile: {n!r} is not in {spec.source_path} "
                             f"(its profiles: {', '.join(known)})")
    if len(names) < 2:
        raise InputError("--profile: name two profiles or more to rank")
    if plan:
        _plan(spec, t, f"tune {', '.join(names)}: one trial each, at most {seconds:g}s of training; nothing "
                       f"runs",
              [(f"{i} ({n})", ops.trial_spec(spec, spec.profile_by_name(n), seconds))
               for i, n in enumerate(names, 1)])
        return
    trials = _trials(spec, spec_path, t, cfg, seconds, 0.9, as_json, start)
    ranked = ops.tune(spec, names, trials)
    sentence = show.tune_sentence(ranked)
    recorded = None
    if apply and ranked[0][1] is not None:
        rates = "; ".join(f"{n} {show.rate(st)}" for n, st, _m, _tr in ranked)
        recorded = t.ask(wire.LedgerAnswer, "ledger", "set", spec.name, ranked[0][0], "good",
                         f"--reason=tune: {rates}")
    if as_json:
        out.print_json(json.dumps({"ranked": [dict(tr.view(), profile=n, margin=m)
                                              for n, _st, m, tr in ranked],
                                   "answer": sentence, "recorded": bool(recorded)}))
        return
    for line in show.tune_lines(ranked):
        out.print(render.lit(line), soft_wrap=True)
    out.print(render.lit(sentence, "bold"), soft_wrap=True)
    if recorded:
        out.print(render.lit(f"recorded in the ledger of {spec.name} on {t.label}: {ranked[0][0]} is "
                             f"known-good"),
                  soft_wrap=True)
