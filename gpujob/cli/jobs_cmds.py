"""``gpujob submit``, ``logs``, ``status``, ``plot``, ``ps``, ``stop``, ``rollback``: a job's life."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from gpujob.agent.base import wire
from gpujob.agent.base.protocol import JobState
from gpujob.ops import bodies
from gpujob.show import ledgerview, plainjson, render
from gpujob.errors import (ConnectError, ConnectionLost, GpujobError, InputError, Interrupted, JobError,
                           RemoteError, SpecError)
if TYPE_CHECKING:
    from gpujob.ops.target import Target
    from gpujob.spec.model import JobSpec
from gpujob.cli.app import (app, ctx, err, out, job_target, live_job_target, _fresh_id, _follow, _print_final,
                            _status)


@app.command()
def submit(spec_path: Path = typer.Argument(..., metavar="SPEC"),
           target: Optional[str] = typer.Option(None, "--target", "-t"),
           profile: Optional[str] = typer.Option(None, "--profile", "-p", help="start on this wheel profile"),
           plan: bool = typer.Option(False, "--plan", help="print every step and command; run nothing"),
           follow: bool = typer.Option(False, "--follow", "-f", help="follow the log until the job ends"),
           clear_caches: Optional[bool] = typer.Option(None, "--clear-caches/--keep-caches",
                                                       help="override caches.clear_on_submit"),
           job_id_opt: Optional[str] = typer.Option(None, "--job-id", help="the job's id (default: "
                                                    "NAME-xxxx); refused if this laptop knows it already"),
           force: bool = typer.Option(False, "--force",
                                      help="start even on a profile the ledger marks bad, or with "
                                                "the job name's ledger unreadable (damaged)"),
           resume_from: Optional[str] = typer.Option(None, "--resume-from", metavar="PATH|JOB",
                                                     help="start the trainer resumed from an earlier job's "
                                                          "checkpoint: a path (relative: the workdir) or a "
                                                          "job id (its newest finished checkpoint)"),
           accept_baseline: bool = typer.Option(False, "--accept-baseline", help="let a profile that holds "
                                                "steady set the baseline although the ledger once had a "
                                                "known-good (a min_ratio-only spec)"),
           as_json: bool = typer.Option(False, "--json", help="the agent's answer, job id and target as one "
                                        "JSON object; with --plan the steps; with -f JSON Lines of the log, "
                                        "then the final status"),
           sets: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                                    help="replace one spec value (dotted key, a YAML value; "
                                                    "repeatable, applied in order, before the recipe)")):
    """Ship the code and start the job under a detached supervisor in the container."""
    from gpujob.ops.plan import build_plan, new_job_id
    from gpujob.ops.ship import sync_sources
    from gpujob.spec.model import load_spec
    spec = load_spec(spec_path, sets or [], profile)
    if job_id_opt is not None:
        from gpujob.agent.base.wire import JOB_ID, JOB_ID_RULE
        if not JOB_ID.fullmatch(job_id_opt):
            raise InputError(f"--job-id: expected {JOB_ID_RULE}, got {job_id_opt[:70]!r}")
    if resume_from is not None and spec.train.checkpoint is None:  # (before --plan too)
        raise InputError("--resume-from needs train.checkpoint in the spec (path and every)")
    if isinstance(spec.target, list):  # multi_node: a list of containers, one job over several nodes
        from gpujob.cli import fleet_cmds
        if as_json and (plan or follow):
            raise InputError("--json: not with --plan or --follow for a multi-node job (yet)")
        clear = spec.caches.clear_on_submit if clear_caches is None else clear_caches
        fleet_cmds.submit(spec, spec_path, target=target, profile=_profile(spec, profile), plan=plan,
                          follow=follow, clear=clear, job_id=job_id_opt, as_json=as_json, force=force,
                          resume_from=resume_from)
        return
    target_name = target or spec.target
    if not target_name:
        raise SpecError(str(spec_path), 1, "target", "missing (required), or pass --target")
    profile = _profile(spec, profile)
    try:
        t = ctx.target(target_name)
    except InputError as e:  # an unknown target named by the spec: say where
        if target or isinstance(e, SpecError):
            raise
        raise SpecError(str(spec_path), spec.line_of(("target",)), "target", e.message, e.hint) from None
    job_id = job_id_opt or (new_job_id(spec.name) if plan else _fresh_id(spec.name))
    clear = spec.caches.clear_on_submit if clear_caches is None else clear_caches
    if plan:
        steps = build_plan(spec, t, job_id, profile, resume_from=resume_from)
        steps.insert(0, _inventory_note(t))
        steps += ledgerview.rollback_target_note(spec)
        if as_json:
            out.print_json(json.dumps({"job_id": job_id, "target": t.label, "profile": profile, "steps": [
                {k: getattr(st, k) for k in ("kind", "where", "what", "when", "argv")} for st in steps]}))
            return
        for line in render.plan_lines(f" for {spec_path} → {t.label} ({t.transport.describe()}), "
                                      f"job {job_id}, profile {profile}; nothing runs", steps):
            out.print(line, soft_wrap=True)
        return
    sync_sources(spec)  # the laptop's side first: nothing remote is touched when it is wrong
    spec.common_requirements(strict=True)
    from gpujob.ops.demofiles import ensure_local_indexes  # the demo's wheels, when missing
    ensure_local_indexes(spec, lambda m: err.print(render.lit(f"· {m}", "dim")))
    if not force:  # the ledger as the container has it; nothing is changed there when refused
        try:
            led = t.ask(wire.LedgerAnswer, "ledger", "show", spec.name).ledger or {}
        except JobError as e:  # a damaged ledger: nothing starts until it is recovered (or --force)
            raise JobError(f"{e.message}; or start without it: submit --force") from None
        entry = (led.get("profiles") or {}).get(profile) or {}
        for line in ledgerview.unlisted_goods_lines(led, spec.name, [p.name for p in spec.profiles]):
            err.print(render.lit(line, "dim"))
        if entry.get("status") == "bad":
            raise JobError(render.bad_profile_refusal(profile, spec.name, t.label, entry, t.name))
    res = _start(spec, spec_path, t, profile, job_id, clear, quiet=as_json, resume_from=resume_from,
                 accept_baseline=accept_baseline)
    if as_json and follow:
        from gpujob.show import jsonl
        jsonl.emit(dict(res.to_dict(), job_id=job_id, target=t.label))
        _follow(job_id, t, "job.log", None, as_json=True)
        st = _status(job_id, t)
        jsonl.emit(render.status_view(st, t.label))
        raise typer.Exit(0 if st.get("state") == JobState.SUCCEEDED else 1)
    if as_json:
        out.print_json(json.dumps(dict(res.to_dict(), job_id=job_id, target=t.label)))
        return
    if follow:
        _follow(job_id, t, "job.log", None)
        raise typer.Exit(0 if _print_final(job_id, t).get("state") == JobState.SUCCEEDED else 1)
    out.print(f"follow it: gpujob logs -f {job_id}    status: gpujob status {job_id}")


def _inventory_note(t: Target):
    """The plan says which hosts file named the target, and that a folder's ./hosts.yaml
    (a clone's example) was not read when the user's own came first (issue 34 row 4)."""
    from gpujob.inventory.hosts import BUILTIN_NAMES, search_paths
    from gpujob.steps import Step
    inv = ctx.targets().inventory
    builtin = inv.source == "embedded default" or (t.label in BUILTIN_NAMES and "local" not in inv.hosts)
    text = f"{t.label}: " + ("gpujob's built-in local/demo (this machine)" if builtin
                             else f"from {inv.source}")
    here = search_paths()[-1]
    if inv.source not in ("embedded default", "recorded with the job") and here.is_file() \
            and here.resolve() != Path(inv.source).resolve():
        text += (f"; {here.absolute()} is not read ({inv.source} comes first; "
                 "--hosts hosts.yaml reads it)")
    return Step("note", "laptop", text)


def interrupted_submit(t: Target, job_id: str, started: bool) -> str:
    """What a Ctrl-C during submit left, in one line: before the supervisor was asked
    to start, nothing runs; after, one short look says whether it did."""
    if not started:
        return (f"interrupted before the supervisor started: nothing runs on {t.label} for job {job_id} "
                "(files already synced stay); submit again when ready")
    try:  # the request went out: look (briefly, without reviving anything) whether it took
        jobs_ = t.ask(wire.StatusAnswer, "status", "--no-revive", "--missing-ok", job_id, timeout=15).jobs
        st = jobs_[0].get("state") if jobs_ else None
    except (GpujobError, KeyboardInterrupt, OSError):
        st = None
    if st == JobState.NOT_FOUND:
        return (f"interrupted while the supervisor was starting: job {job_id} is not (yet) on {t.label}; "
                f"look again with gpujob status {job_id} before submitting again")
    what = f"is {st}" if st else "may be running (it could not be asked)"
    return (f"interrupted after the supervisor was asked to start: job {job_id} {what} on {t.label} and goes "
            f"on; follow it: gpujob logs -f {job_id}    end it: gpujob stop {job_id}")


def _profile(spec: JobSpec, name: str | None) -> str:
    """The profile a submit starts on: the one named (an unknown name refused), else the
    spec's (its validator sets it: the first profile when the spec names none)."""
    chosen = spec.profile_by_name(name).name if name else spec.profile
    if chosen is None:
        raise TypeError("spec.profile: not set")
    return chosen


def _start(spec, spec_path: Path, t: Target, profile: str, job_id: str, clear: bool, quiet: bool = False,
           resume_from: str | None = None, accept_baseline: bool = False) -> wire.SubmitAnswer:
    """Record the job on this laptop, submit it, say so. The record comes first, so
    an id this laptop already knows is refused before anything starts remotely."""
    from gpujob.ops import submit as submit_op
    from gpujob.spec.model import spec_hash
    state = ctx.state()
    from gpujob.agent.base.proc import die_here
    state.reserve(job_id, spec.name, t.label, str(spec_path.resolve()), spec_hash(spec), profile,
                  entry=ctx.entry(t))
    die_here("submit_reserved")  # the suite's death points (GPUJOB_TEST_DIE_AT): a phantom row, a real job
    said = []
    if spec.recipe and not quiet:  # job.json records it too: a new gpujob's changed recipe is never silent
        from gpujob.spec.recipes.registry import RECIPES
        r = RECIPES[spec.recipe]
        err.print(render.lit(f"· recipe {r.name} revision {r.revision} ({r.read_from}; `--plan` lists its "
                             f"keys)", "dim"), soft_wrap=True)

    from gpujob.show.waits import Wait
    wait = Wait(err, "probing the container")

    def progress(message: str) -> None:
        said.append(message)
        err.print(render.lit(f"· {message}", "dim"))
        if message == "starting the supervisor":
            state.asking(job_id)  # a death from here on may leave a real job: Tab offers its row
            wait.say("shipping the code and starting the supervisor")
        elif message.startswith(("probing ", "sync ")):
            wait.say(message if message.startswith("probing ") else "listing the files to ship")

    def on_read(done: int, total: int) -> None:  # the sync's tar streams going out
        if done < total:
            wait.bytes(done, total)
        else:
            wait.say(f"waiting for the supervisor to start ({total / 1e6:.1f} MB shipped)")
    progress.on_read = on_read  # type: ignore[attr-defined]  # jobs.submit counts stdin's bytes to it
    try:
        with wait:
            res = submit_op.submit(spec, t, profile=profile, job_id=job_id, clear_caches=clear,
                                   resume_from=resume_from, accept_baseline=accept_baseline,
                                   progress=progress)
    except KeyboardInterrupt:
        started = "starting the supervisor" in said
        state.seen(job_id, JobState.UNKNOWN) if started else state.unreserve(job_id)
        raise Interrupted(interrupted_submit(t, job_id, started)) from None
    except ConnectionLost:  # cut off mid-submit: the job may run there; ps and status will tell
        state.seen(job_id, JobState.UNKNOWN)
        raise
    except (InputError, JobError, ConnectError):  # refused or never reached: nothing started
        state.unreserve(job_id)
        raise
    except RemoteError as e:  # the agent said why it failed: no supervisor started, no job row
        state.unreserve(job_id) if e.answered else state.seen(job_id, JobState.UNKNOWN)
        raise
    except BaseException:  # cut off mid-submit: the job may run there; ps and status will tell
        state.seen(job_id, JobState.UNKNOWN)
        raise
    die_here("submit_answered")
    state.seen(job_id, JobState.PREPARING)
    if res.stale_lock:
        err.print(render.styled(("note:", "yellow"), f" took over the container from job "
                                f"{res.stale_lock.get('job_id')} (its supervisor, pid "
                                f"{res.stale_lock.get('pid')}, was gone and nothing of it ran)"))
    if not quiet:
        out.print(render.styled("submitted ", (job_id, "bold"), f" to {t.label} (profile {profile}, "
                                f"supervisor pid {res.supervisor_pid})"))
    return res


# ---- logs / status / ps / stop / rollback ----------------------------------

@app.command()
def logs(job: Optional[str] = typer.Argument(None, help="job id (default: the most recent)"),
         follow: bool = typer.Option(False, "--follow", "-f", help="follow until the job ends"),
         phase: Optional[str] = typer.Option(None, "--phase", help="warmup, train or prepare: "
                                             "that phase's raw log"),
         events: bool = typer.Option(False, "--events", help="the event journal instead of the log"),
         samples: bool = typer.Option(False, "--samples", help="every throughput sample of the last "
                                      "journal.full_rate_samples (events hold one summary a minute)"),
         stacks: bool = typer.Option(False, "--stacks", help="the Python stacks gpujob saved before it "
                                     "ended a hung trainer (start_hang, stall, compile_race)"),
         tail: Optional[int] = typer.Option(None, "--tail", "-n", help="start from the last N lines"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         node: Optional[int] = typer.Option(None, "--node", help="a multi-node job: only node I's log"),
         trace: bool = typer.Option(False, "--trace", help="export the job's trace (raw output lines and "
                                    "checkpoint events, for gpujob replay) to -o FILE"),
         output: Optional[Path] = typer.Option(None, "--output", "-o",
                                               help="with --trace: the file to write"),
         as_json: bool = typer.Option(False, "--json", help="JSON Lines: each record of --events/--samples "
                                      "as written, else {\"line\": TEXT} a log line")):
    """Print a job's log; with -f follow it, surviving dropped connections."""
    if phase not in (None, "warmup", "train", "prepare"):
        raise InputError(f"--phase: expected warmup, train or prepare, got {phase!r}")
    if trace or output is not None:
        if not (trace and output is not None):
            raise InputError("--trace needs -o FILE (and -o is only for --trace)")
        from gpujob.cli.replay_cmds import fetch_file, fetch_trace, trace_limit
        from gpujob.agent.base import jsonl
        from gpujob.agent.base.fsio import write_bytes
        job_id, t = job_target(job, target)
        try:  # each part at most what the job's journal.keep_log lets it grow to
            limit = trace_limit(jsonl.loads(fetch_file(job_id, t, "job.json", limit=16 << 20)))
        except ValueError:
            raise InputError(f"job {job_id}: its job.json does not parse") from None
        write_bytes(str(output), fetch_trace(job_id, t, limit))  # an atomic replace
        return
    from gpujob.cli import fleet_cmds
    fleet_id, labels = fleet_cmds.nodes_of(job, target)
    if labels:  # a multi-node job: every node's log, [node i] before each line (or --node i)
        file = ("events.jsonl" if events else "samples.jsonl" if samples else f"{phase}.log" if phase
                else "job.log")
        if as_json and node is None:
            raise InputError("--json: pick one node of this multi-node job with --node I")
        fleet_cmds.logs(fleet_id, labels, follow=follow, node=node, file=file, tail=tail,
                        events=events or samples, as_json=as_json)
        return
    if node is not None:
        raise InputError("--node: only for a multi-node job")
    job_id, t = job_target(job, target)
    if stacks:
        if follow or events or samples or phase or tail is not None:
            raise InputError("--stacks: takes no --follow, --events, --samples, --phase or --tail")
        _show_stacks(job_id, t, as_json)
        return
    file = ("events.jsonl" if events else "samples.jsonl" if samples else f"{phase}.log" if phase
            else "job.log")
    _follow(job_id, t, file, tail, follow=follow, events=events or samples, as_json=as_json)
    if follow:  # the job ended: its outcome is the exit code (0 only for succeeded), as `submit -f`'s
        st = _status(job_id, t)
        if st.get("state") != JobState.SUCCEEDED:  # one line (a JSON object under --json), exit 1
            raise GpujobError(f"job {job_id} {st.get('state')}"
                              + (f": {st['reason']}" if st.get("reason") else ""))


def _show_stacks(job_id: str, t: Target, as_json: bool) -> None:
    """The ``stacks`` events of a job: a header line each, then the stack text as the
    trainer's interpreter (or py-spy) wrote it, as data."""
    import sys
    import time
    from gpujob.ops.follow import follow_log
    from gpujob.agent.base import jsonl
    r, got = jsonl.Records("events.jsonl", strict=False), []  # bounded, as every reader of a journal
    follow_log(t, job_id, file="events.jsonl", follow=False, write=lambda c: got.extend(r.feed(c)),
               notice=lambda m: err.print(render.lit(f"gpujob: {m}", "yellow")))
    found = [rec for _n, rec in got + r.close() if rec.get("type") == "stacks"
             and not render.event_error(rec)]
    so = sys.stdout
    if as_json:
        for rec in found:
            so.write(json.dumps(rec, sort_keys=True) + "\n")
        return
    if not found:
        err.print(render.lit(f"gpujob: no stacks saved for {job_id} (gpujob saves them before it ends a hung "
                             f"trainer: a start_hang, a stall, a compile race)"))
        return
    for rec in found:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.get("t", 0)))
        so.write(f"== {rec.get('phase')} {rec.get('signal')} at {when}, via {rec.get('method')}: "
                 f"{rec.get('reason')}\n")
        if rec.get("note"):
            so.write(f"   {rec['note']}\n")
        stacks = rec.get("stacks")
        for st in [st for st in (stacks if isinstance(stacks, list) else []) if isinstance(st, dict)]:
            argv = st.get("argv")
            words = [str(a) for a in argv] if isinstance(argv, list) else []
            so.write(f"-- pid {st.get('pid')}: {' '.join(words)}\n")
            text = str(st.get("text") or "")
            so.write(text if text.endswith("\n") else text + "\n")
    so.flush()


@app.command()
def status(job: Optional[str] = typer.Argument(None), as_json: bool = typer.Option(False, "--json"),
           target: Optional[str] = typer.Option(None, "--target", "-t")):
    """State, phase, profile, tok/s with its trend and threshold, rollbacks."""
    from gpujob.cli import fleet_cmds
    fleet_id, labels = fleet_cmds.nodes_of(job, target)
    if labels:  # a multi-node job: one job, a row per node
        fleet_cmds.status(fleet_id, labels, as_json)
        return
    bodies.show_status(ctx, *job_target(job, target), as_json, out, err)



@app.command()
def plot(job: Optional[str] = typer.Argument(None, help="job id (default: the most recent)"),
         output: Optional[Path] = typer.Option(None, "--output", "-o", help="FILE.png, .svg or .html "
                                               "(default: a plot in the terminal)"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         as_json: bool = typer.Option(False, "--json", help="the plotted series as one JSON object")):
    """tok/s over time: phases shaded, the threshold, known-good baselines, each rollback marked."""
    from gpujob.ops import plot as plot_
    job_id, t = job_target(job, target)
    plot_.command(job_id, t, _status(job_id, t), output, as_json, out)

PS_WORKERS, PS_TIMEOUT = bodies.PS_WORKERS, bodies.PS_TIMEOUT  # (the daemon's ps: bodies' own)


@app.command()
def ps(target: Optional[str] = typer.Argument(None, help="only this container's jobs"),
       all_: bool = typer.Option(False, "--all", help="every job in TARGET's journal, whichever laptop "
                                 "started it (with who did)"),
       as_json: bool = typer.Option(False, "--json"),
       limit: int = typer.Option(20, help="how many recent jobs"),
       timeout: float = typer.Option(PS_TIMEOUT, "--timeout", min=0.1,
                                     help="seconds to wait for the containers' answers; a host that "
                                          "gives none by then is shown unreachable")):
    """Jobs started from this laptop, with their state fetched from the containers (all at once)."""
    if all_:
        return _ps_all(target, as_json, limit)
    rows = bodies.ps_rows(ctx, target, limit)
    bodies.show_ps(ctx, rows, as_json, timeout, PS_WORKERS, out, err)


def _ps_all(target: Optional[str], as_json: bool, limit: int) -> None:
    """``ps --all TARGET``: the container's journal, newest first; looks only (no
    dead supervisor is restarted by asking)."""
    if target is None:
        raise InputError("ps --all: name the container: gpujob ps --all TARGET")
    t = ctx.target(target)
    res = t.ask(wire.StatusAnswer, "status", "--no-revive", "--newest", str(max(0, limit)))  # bounded
    jobs_ = res.jobs
    jobs_.sort(key=lambda st: st.get("submitted_at") or 0, reverse=True)
    older = (res.extra.get("more") or {}).get("jobs")
    if older and not as_json:
        err.print(render.lit(f"gpujob: {older} older jobs in {t.label}'s journal not listed (--limit N lists "
                             f"more)"))
    mine = {r["job_id"] for r in ctx.state().jobs(100000) if r["target"] == t.label}
    views = [dict(render.status_view(st, t.label), mine=st.get("job_id") in mine) for st in jobs_[:limit]]
    if as_json:
        plainjson.print_json(out, json.dumps(views))
        return
    out.print(render.ps_table(views, by=True))


@app.command()
def stop(job: Optional[str] = typer.Argument(None, help="job id (default: the one job still running)"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         as_json: bool = typer.Option(False, "--json")):
    """SIGTERM the trainer's process group, SIGKILL after the grace period, confirm it is gone."""
    job_id, t = live_job_target(job, target)
    from gpujob.cli import fleet_cmds
    labels = [] if target else ctx.state().nodes(job_id)
    if labels:  # every node of a multi-node job
        fleet_cmds.stop(job_id, labels, as_json)
        return
    res = t.ask(wire.StopAnswer, "stop", job_id, timeout=600)
    if res.state:
        ctx.state().seen(job_id, res.state)
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
    if res.left:
        err.print(render.lit(f"gpujob: processes of {job_id} still alive: {res.left}", "red"))
        raise typer.Exit(1)
    if not as_json:
        saved = res.save_waited or {}
        if isinstance(saved.get("waited"), (int, float)):  # a save in progress was let finish first
            out.print(render.lit(f"waited {saved['waited']:g}s for a checkpoint save before signalling "
                                 "the trainer"
                                 + ("" if saved.get("finished") else f" (unfinished: {saved.get('left')})")))
        out.print(render.lit(f"{job_id}: {res.state}" + (" (it had already ended)" if res.already else "")))


@app.command()
def rollback(job: Optional[str] = typer.Argument(None, help="job id (default: the one job still running)"),
             to: Optional[str] = typer.Option(None, "--to", help="profile (default: the last known-good)"),
             mark_bad: bool = typer.Option(False, "--mark-bad", help="also record the profile left bad "
                                           "(by default a rollback by hand judges nothing)"),
             target: Optional[str] = typer.Option(None, "--target", "-t"),
             as_json: bool = typer.Option(False, "--json")):
    """Roll a job back to the last known-good wheel profile (or --to one), resuming training."""
    job_id, t = live_job_target(job, target)
    from gpujob.cli import fleet_cmds
    labels = [] if target else ctx.state().nodes(job_id)
    if labels:  # node 0 decides for every node
        fleet_cmds.rollback(job_id, labels, to, mark_bad, as_json)
        return
    res = t.ask(wire.RollbackAnswer, "rollback", job_id, *(["--to", to] if to else []),
                *(["--mark-bad"] if mark_bad else []), timeout=120)
    if as_json:
        out.print_json(json.dumps(dict(res.to_dict(), mark_bad=mark_bad)))
        return
    out.print(render.rollback_line(job_id, res, mark_bad))
    for line in render.dropped_stop_lines(job_id, res):
        out.print(line)
    out.print(f"follow it: gpujob logs -f {job_id}")
