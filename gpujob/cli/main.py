"""The ``gpujob`` command line (typer). The only place that prints.

Every error a user can cause ends as one line on stderr and a non-zero exit
code (2 for bad input), never a traceback.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from gpujob import __version__, kinds
from gpujob.agent.protocol import ENDED, FINAL_STATES, JobState
from gpujob.cli import conventions, render
from gpujob.conn import commands
from gpujob.errors import ConnectError, ConnectionLost, GpujobError, InputError, JobError, SpecError
from gpujob.inventory import entry_of, find_inventory, load_inventory, load_inventory_data
from gpujob.target import Target, Targets
from gpujob.transport.base import RawStdin

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run GPU training jobs in Proxmox LXC containers: wheel profiles as venvs, "
                       "a detached supervisor, throughput watch and automatic rollback.")
cache_app = typer.Typer(no_args_is_help=True, help="Per-profile compile caches.")
app.add_typer(cache_app, name="cache")
ledger_app = typer.Typer(no_args_is_help=True, help="The known-good ledger of a job name, by hand.")
app.add_typer(ledger_app, name="ledger")
app.command("completion")(conventions.completion)

out = render.console()
err = render.console(stderr=True)


class Ctx:
    hosts: Optional[str] = None
    accept_new: bool = False
    _targets: Optional[Targets] = None
    _state = None

    def __init__(self):
        self._recorded: dict[str, Targets] = {}  # targets opened from a job's recorded entry
        self._lock = threading.Lock()

    def targets(self) -> Targets:
        if self._targets is None:
            from gpujob.conn import paths
            self._targets = Targets(load_inventory(find_inventory(self.hosts)), accept_new=self.accept_new,
                                    kept=paths.kept())
        return self._targets

    def target(self, name: str) -> Target:
        """A target of the inventory; one it does not know, but with which this laptop
        recorded a job (host/name, submitted from another directory), through the
        inventory entry recorded with that job."""
        try:
            return self.targets().open(name)
        except InputError:
            if "/" not in name:
                raise
        with self._lock:  # `ps` opens targets from several threads
            if name not in self._recorded:
                entry = self.state().entry(name)
                if entry is None:
                    return self.targets().open(name)  # the inventory's own error
                self._recorded[name] = Targets(load_inventory_data(entry), accept_new=self.accept_new)
        return self._recorded[name].open(name)

    def entry(self, t: Target) -> dict | None:
        """The inventory entry that reached ``t``, to record with a job."""
        for targets in [self._recorded.get(t.label), self._targets]:
            if targets is not None:
                try:
                    return entry_of(targets.inventory, t.label)
                except InputError:
                    pass
        return None

    def state(self):
        if self._state is None:
            from gpujob.state import State
            self._state = State()
        return self._state

    def close(self) -> None:
        if self._targets is not None:
            self._targets.close()
        for targets in self._recorded.values():
            targets.close()
        self._recorded.clear()
        if self._state is not None:
            self._state.close()


ctx = Ctx()


def _version(value: bool) -> None:
    if value:
        out.print(f"gpujob {__version__}")
        raise typer.Exit()


@app.callback()
def _main(hosts: Optional[str] = typer.Option(None, "--hosts", help="inventory file (else $GPUJOB_HOSTS, "
                                              "./hosts.yaml, ~/.config/gpujob/hosts.yaml, built-in local)"),
          accept_new: bool = typer.Option(False, "--accept-new", help="trust and record an unknown host key "
                                          "(like OpenSSH's accept-new); a changed key is always refused"),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="print the version")):
    ctx.hosts = hosts
    ctx.accept_new = accept_new


def job_target(job: Optional[str], target: Optional[str]) -> tuple[str, Target]:
    """(job id, target) of a job this laptop knows, or of JOB on --target."""
    return commands.job_target(ctx, job, target)


def live_job_target(job: Optional[str], target: Optional[str]) -> tuple[str, Target]:
    """``stop``/``rollback``: a named job, or the one job of this laptop's index not
    ended (as last seen, or as its container says now); else the candidates, exit 2."""
    if job is not None or target:
        return job_target(job, target)
    rows = [r for r in ctx.state().jobs(1000) if r["state"] not in FINAL_STATES]
    by_target: dict[str, list[str]] = {}
    for r in rows:
        by_target.setdefault(r["target"], []).append(r["job_id"])
    fetched: dict[str, str] = {}
    for name, ids in by_target.items():
        try:  # look only: no dead supervisor is restarted by asking
            jobs_ = ctx.target(name).agent_json("status", "--no-revive", "--missing-ok", *ids)["jobs"]
        except GpujobError:
            continue  # out of reach: as last seen
        for st in jobs_:
            fetched[st["job_id"]] = st.get("state")
            if st.get("state") != JobState.NOT_FOUND:
                ctx.state().seen(st["job_id"], st.get("state"))
    cands = [(r["job_id"], r["target"], fetched.get(r["job_id"], r["state"])) for r in rows]
    cands = [c for c in cands if c[2] not in FINAL_STATES + (JobState.NOT_FOUND,)]
    if len(cands) != 1:
        raise InputError(render.candidates_line(cands))
    return cands[0][0], ctx.target(cands[0][1])


# ---- exec ------------------------------------------------------------------

@app.command("exec")
def exec_(target: str = typer.Argument(..., help="container name or host/name"),
          argv: List[str] = typer.Argument(None, help="the command, after --"),
          timeout: Optional[float] = typer.Option(None, help="end the command after this many seconds"),
          no_stdin: bool = typer.Option(False, "--no-stdin", "-n", help="do not read stdin (like ssh -n): "
                                        "the command gets an empty one"),
          as_json: bool = typer.Option(False, "--json", help="JSON Lines: {stream, data} per chunk of output, "
                                       "then {exit_code, timed_out}")):
    """Run one command in the container; output streamed, exit code passed through."""
    if not argv:
        raise InputError("exec: no command given; usage: gpujob exec TARGET -- COMMAND [ARGS...]")
    t = ctx.target(target)
    stdin = None if no_stdin or sys.stdin is None or sys.stdin.isatty() else RawStdin(0)
    so, se = sys.stdout.buffer, sys.stderr.buffer
    on_out, on_err = lambda b: (so.write(b), so.flush()), lambda b: (se.write(b), se.flush())
    if as_json:
        from gpujob.cli import jsonl
        on_out, on_err = jsonl.Chunks("stdout"), jsonl.Chunks("stderr")
    r = t.run(argv, stdin=stdin, timeout=timeout, on_stdout=on_out, on_stderr=on_err)
    if as_json:
        on_out.close()
        on_err.close()
        jsonl.emit({"exit_code": r.exit_code, "timed_out": bool(r.timed_out)})
    commands.say_timed_out(r, timeout, t, err)
    raise typer.Exit(r.exit_code)


@app.command()
def disconnect():
    """End the kept connection: the background process holding SSH connections (README)."""
    from gpujob.conn.client import disconnect as end
    from gpujob.conn.entry import disconnect_line
    print(disconnect_line(end()))


# ---- doctor / hosts --------------------------------------------------------

@app.command()
def doctor(target: Optional[str] = typer.Argument(None, help="container (default: every target)"),
           spec: Optional[Path] = typer.Option(None, "--spec", help="also check the driver against "
                                               "the CUDA of this job's profiles"),
           as_json: bool = typer.Option(False, "--json")):
    """Check a target: host key, pct, container, python3, uv, disk, GPUs and driver."""
    from gpujob import doctor as doc
    cudas: list[str] = []
    workdir = None
    if spec is not None:
        from gpujob.spec import load_spec
        s = load_spec(spec)
        cudas = sorted({p.cuda for p in s.profiles if p.cuda})
        workdir = s.workdir
        target = target or s.target
    names = (target if isinstance(target, list) else [target]) if target else \
        [f"{h}/{c}" for h, c in ctx.targets().inventory.targets()]  # a list: every node of a multi-node spec
    report = {}
    failed = False
    for name in names:
        try:
            t = ctx.target(name)
            label = t.label
            checks = doc.judge(doc.gather(t, workdir), expected_gpus=t.expected_gpus, cudas=cudas)
        except GpujobError as e:  # one target out of reach is a failed check, not the end of doctor
            if isinstance(e, InputError):
                raise
            label, checks = name, doc.with_fixes([doc.Check("connect", doc.CheckStatus.FAIL, e.message, e.hint or "")])
        report[label] = [c.as_dict() for c in checks]
        failed |= any(c.status == doc.CheckStatus.FAIL for c in checks)
        if not as_json:
            out.print(render.doctor_table(label, checks))
    if as_json:
        out.print_json(json.dumps(report))
    else:
        out.print(render.doctor_summary(collections.Counter(c["status"] for cs in report.values() for c in cs)))
    raise typer.Exit(1 if failed else 0)


@app.command()
def hosts(as_json: bool = typer.Option(False, "--json"),
          check: bool = typer.Option(False, "--check", help="only validate the inventory file; "
                                     "connect to nothing (exit 0 when valid, 2 with the first problem)")):
    """The inventory with each container's status (hosts queried in parallel)."""
    if check:
        path = find_inventory(ctx.hosts)
        inv = load_inventory(path)
        if as_json:
            out.print_json(json.dumps({"path": str(path) if path else None, "valid": True,
                                       "hosts": len(inv.hosts), "containers": len(inv.targets())}))
            return
        out.print(render.lit(f"{path or 'built-in inventory'}: ok ({len(inv.hosts)} hosts, "
                             f"{len(inv.targets())} containers)"))
        return
    targets = ctx.targets()
    inv = targets.inventory

    def one(host_name: str) -> list[dict]:
        rows = []
        for cname in inv.hosts[host_name].containers:
            row = {"host": host_name, "container": cname, "kind": inv.hosts[host_name].kind}
            try:
                t = targets.open(f"{host_name}/{cname}")
                row["vmid"] = t.vmid
                row["status"] = t.driver.status(t)
                if row["status"] in kinds.READY:
                    jobs = t.agent_json("status").get("jobs", [])
                    live = [j for j in jobs if j.get("state") not in ENDED]
                    row["job"] = live[-1]["job_id"] if live else None
            except GpujobError as e:
                row["status"] = "unreachable"
                row["error"] = e.message
            rows.append(row)
        return rows

    with ThreadPoolExecutor(max_workers=max(1, len(inv.hosts))) as pool:
        rows = [r for part in pool.map(one, list(inv.hosts)) for r in part]
    if as_json:
        out.print_json(json.dumps({"source": inv.source, "targets": rows}))
        return
    out.print(render.hosts_table(rows, inv.source))


# ---- submit ----------------------------------------------------------------

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
           force: bool = typer.Option(False, "--force", help="start even on a profile the ledger marks bad"),
           as_json: bool = typer.Option(False, "--json", help="the agent's answer, job id and target as one "
                                        "JSON object; with --plan the steps; with -f JSON Lines of the log, "
                                        "then the final status")):
    """Ship the code and start the job under a detached supervisor in the container."""
    from gpujob import jobs
    from gpujob.spec import load_spec
    spec = load_spec(spec_path)
    if job_id_opt is not None:
        import re
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", job_id_opt):
            raise InputError(f"--job-id: expected lowercase letters, digits and '-' (at most 63), "
                             f"got {job_id_opt[:70]!r}")
    if spec.multi_node:  # a list of containers: one job over several nodes
        from gpujob.cli import fleet_cmds
        if as_json and (plan or follow):
            raise InputError("--json: not with --plan or --follow for a multi-node job (yet)")
        clear = spec.caches.clear_on_submit if clear_caches is None else clear_caches
        fleet_cmds.submit(spec, spec_path, target=target, profile=spec.profile_by_name(profile).name if profile
                          else spec.profile, plan=plan, follow=follow, clear=clear, job_id=job_id_opt,
                          as_json=as_json, force=force)
        return
    target_name = target or spec.target
    if not target_name:
        raise SpecError(str(spec_path), 1, "target", "missing (required), or pass --target")
    profile = spec.profile_by_name(profile).name if profile else spec.profile
    try:
        t = ctx.target(target_name)
    except InputError as e:  # an unknown target named by the spec: say where
        if target or isinstance(e, SpecError):
            raise
        raise SpecError(str(spec_path), spec.line_of(("target",)), "target", e.message, e.hint) from None
    job_id = job_id_opt or (jobs.new_job_id(spec.name) if plan else _fresh_id(spec.name))
    clear = spec.caches.clear_on_submit if clear_caches is None else clear_caches
    if plan:
        steps = jobs.build_plan(spec, t, job_id, profile)
        if as_json:
            out.print_json(json.dumps({"job_id": job_id, "target": t.label, "profile": profile, "steps": [
                {k: getattr(st, k) for k in ("kind", "where", "what", "when", "argv")} for st in steps]}))
            return
        for line in render.plan_lines(f" for {spec_path} → {t.label} ({t.transport.describe()}), "
                                      f"job {job_id}, profile {profile}; nothing runs", steps):
            out.print(line, soft_wrap=True)
        return
    jobs.sync_sources(spec)  # the laptop's side first: nothing remote is touched when it is wrong
    spec.common_requirements(strict=True)
    from gpujob.demofiles import ensure_local_indexes  # the demo's wheels, when missing
    ensure_local_indexes(spec, lambda m: err.print(render.lit(f"· {m}", "dim")))
    if not force:  # the ledger as the container has it; nothing is changed there when refused
        entry = (t.agent_json("ledger", "show", spec.name)["ledger"].get("profiles") or {}).get(profile) or {}
        if entry.get("status") == "bad":
            raise JobError(render.bad_profile_refusal(profile, spec.name, t.label, entry, t.name))
    res = _start(spec, spec_path, t, profile, job_id, clear, quiet=as_json)
    if as_json and follow:
        from gpujob.cli import jsonl
        jsonl.emit(dict(res, job_id=job_id, target=t.label))
        _follow(job_id, t, "job.log", None, as_json=True)
        st = _status(job_id, t)
        jsonl.emit(render.status_view(st, t.label))
        raise typer.Exit(0 if st.get("state") == JobState.SUCCEEDED else 1)
    if as_json:
        out.print_json(json.dumps(dict(res, job_id=job_id, target=t.label)))
        return
    if follow:
        _follow(job_id, t, "job.log", None)
        raise typer.Exit(0 if _print_final(job_id, t).get("state") == JobState.SUCCEEDED else 1)
    out.print(f"follow it: gpujob logs -f {job_id}    status: gpujob status {job_id}")


def _fresh_id(name: str) -> str:
    """A new job id this laptop has not used."""
    from gpujob import jobs
    while True:
        job_id = jobs.new_job_id(name)
        if not ctx.state().known(job_id):
            return job_id


def _start(spec, spec_path: Path, t: Target, profile: str, job_id: str, clear: bool, quiet: bool = False) -> dict:
    """Record the job on this laptop, submit it, say so. The record comes first, so
    an id this laptop already knows is refused before anything starts remotely."""
    from gpujob import jobs
    from gpujob.spec import spec_hash
    state = ctx.state()
    state.reserve(job_id, spec.name, t.label, str(spec_path.resolve()), spec_hash(spec), profile,
                  entry=ctx.entry(t))
    try:
        res = jobs.submit(spec, t, profile=profile, job_id=job_id, clear_caches=clear,
                          progress=lambda m: err.print(render.lit(f"· {m}", "dim")))
    except ConnectionLost:  # cut off mid-submit: the job may run there; ps and status will tell
        state.seen(job_id, JobState.UNKNOWN)
        raise
    except (InputError, JobError, ConnectError):  # refused or never reached: nothing started
        state.unreserve(job_id)
        raise
    except BaseException:  # cut off mid-submit: the job may run there; ps and status will tell
        state.seen(job_id, JobState.UNKNOWN)
        raise
    state.seen(job_id, JobState.PREPARING)
    if res.get("stale_lock"):
        err.print(render.styled(("note:", "yellow"), f" took over the container from job "
                                f"{res['stale_lock'].get('job_id')} (its supervisor, pid "
                                f"{res['stale_lock'].get('pid')}, was gone and nothing of it ran)"))
    if not quiet:
        out.print(render.styled("submitted ", (job_id, "bold"), f" to {t.label} (profile {profile}, "
                                f"supervisor pid {res['supervisor_pid']})"))
    return res


def _print_final(job_id: str, t: Target) -> dict:
    st = _status(job_id, t)
    print_status_view(st, t)
    return st


def print_status_view(st: dict, t: Target) -> None:
    render.print_status(out, render.status_view(st, t.label))


def _status(job_id: str, t: Target) -> dict:
    return commands.fetch_status(ctx, job_id, t, err)


def _say_revived(st: dict) -> None:
    commands.say_revived(st, err)


def _follow(job_id: str, t: Target, file: str, last: Optional[int], follow: bool = True,
            events: bool = False, as_json: bool = False) -> None:
    from gpujob import jobs
    so = sys.stdout.buffer
    buf = bytearray()
    lines = None
    if as_json:  # JSON Lines: the journal's records as written, or {"line": ...} a log line
        from gpujob.cli import jsonl
        lines = jsonl.Lines(events, damaged=lambda n: err.print(
            render.lit(f"gpujob: skipped a damaged record in {file} ({n} bytes)")))

    def write(chunk: bytes) -> None:
        if not events:
            so.write(chunk)
            so.flush()
            return
        buf.extend(chunk)
        *lines, rest = bytes(buf).split(b"\n")
        buf[:] = rest
        for ln in lines:
            ln = ln.lstrip(b"\0")
            if not ln.strip():
                continue
            try:
                rec = json.loads(ln)
            except ValueError:  # a torn record (the writer died mid-line): say so, go on
                err.print(render.lit(f"gpujob: skipped a damaged record in {file} ({len(ln)} bytes)"))
                continue
            out.print(render.lit(render.event_line(rec)))

    try:
        jobs.follow_log(t, job_id, file=file, follow=follow, last=last, write=lines or write,
                        notice=lambda m: err.print(render.lit(f"gpujob: {m}", "yellow")))
        if lines:
            lines.close()
    except KeyboardInterrupt:
        err.print(f"\ndetached from {job_id}; it keeps running (gpujob logs -f {job_id})")
        raise typer.Exit(130)


# ---- logs / status / ps / stop / rollback ----------------------------------

@app.command()
def logs(job: Optional[str] = typer.Argument(None, help="job id (default: the most recent)"),
         follow: bool = typer.Option(False, "--follow", "-f", help="follow until the job ends"),
         phase: Optional[str] = typer.Option(None, "--phase", help="warmup, train or prepare: "
                                             "that phase's raw log"),
         events: bool = typer.Option(False, "--events", help="the event journal instead of the log"),
         samples: bool = typer.Option(False, "--samples", help="every throughput sample of the last "
                                      "journal.full_rate_samples (events hold one summary a minute)"),
         tail: Optional[int] = typer.Option(None, "--tail", "-n", help="start from the last N lines"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         node: Optional[int] = typer.Option(None, "--node", help="a multi-node job: only node I's log"),
         as_json: bool = typer.Option(False, "--json", help="JSON Lines: each record of --events/--samples "
                                      "as written, else {\"line\": TEXT} a log line")):
    """Print a job's log; with -f follow it, surviving dropped connections."""
    if phase not in (None, "warmup", "train", "prepare"):
        raise InputError(f"--phase: expected warmup, train or prepare, got {phase!r}")
    from gpujob.cli import fleet_cmds
    fleet_id, labels = fleet_cmds.nodes_of(job, target)
    if labels:  # a multi-node job: every node's log, [node i] before each line (or --node i)
        file = "events.jsonl" if events else "samples.jsonl" if samples else f"{phase}.log" if phase else "job.log"
        if as_json and node is None:
            raise InputError("--json: pick one node of this multi-node job with --node I")
        fleet_cmds.logs(fleet_id, labels, follow=follow, node=node, file=file, tail=tail,
                        events=events or samples, as_json=as_json)
        return
    if node is not None:
        raise InputError("--node: only for a multi-node job")
    job_id, t = job_target(job, target)
    file = "events.jsonl" if events else "samples.jsonl" if samples else f"{phase}.log" if phase else "job.log"
    _follow(job_id, t, file, tail, follow=follow, events=events or samples, as_json=as_json)


@app.command()
def status(job: Optional[str] = typer.Argument(None), as_json: bool = typer.Option(False, "--json"),
           target: Optional[str] = typer.Option(None, "--target", "-t")):
    """State, phase, profile, tok/s with its trend and threshold, rollbacks."""
    from gpujob.cli import fleet_cmds
    fleet_id, labels = fleet_cmds.nodes_of(job, target)
    if labels:  # a multi-node job: one job, a row per node
        fleet_cmds.status(fleet_id, labels, as_json)
        return
    commands.show_status(ctx, *job_target(job, target), as_json, out, err)



@app.command()
def plot(job: Optional[str] = typer.Argument(None, help="job id (default: the most recent)"),
         output: Optional[Path] = typer.Option(None, "--output", "-o", help="FILE.png, .svg or .html "
                                               "(default: a plot in the terminal)"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         as_json: bool = typer.Option(False, "--json", help="the plotted series as one JSON object")):
    """tok/s over time: phases shaded, the threshold, known-good baselines, each rollback marked."""
    from gpujob.cli import plot as plot_
    job_id, t = job_target(job, target)
    plot_.command(job_id, t, _status(job_id, t), output, as_json, out)

@app.command()
def ps(target: Optional[str] = typer.Argument(None, help="only this container's jobs"),
       all_: bool = typer.Option(False, "--all", help="every job in TARGET's journal, whichever laptop "
                                 "started it (with who did)"),
       as_json: bool = typer.Option(False, "--json"),
       limit: int = typer.Option(20, help="how many recent jobs")):
    """Jobs started from this laptop, with their state fetched from the containers."""
    if all_:
        return _ps_all(target, as_json, limit)
    rows = ctx.state().jobs(limit if target is None else 1000)
    if target is not None:
        label = ctx.target(target).label
        rows = [r for r in rows if r["target"] == label][:limit]
    by_target: dict[str, list[str]] = {}
    for r in rows:
        by_target.setdefault(r["target"], []).append(r["job_id"])

    def fetch(target: str) -> dict:
        try:
            t = ctx.target(target)
            return {s["job_id"]: s for s in t.agent_json("status", "--missing-ok", *by_target[target])["jobs"]}
        except GpujobError as e:
            return {j: {"state": "unreachable", "reason": e.message} for j in by_target[target]}

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(by_target)))) as pool:
        states = {}
        for part in pool.map(fetch, list(by_target)):
            states.update(part)
    views = []
    for r in rows:
        st = states.get(r["job_id"], {})
        if st.get("state") != "unreachable":
            ctx.state().seen(r["job_id"], st.get("state"))
        views.append(render.status_view(dict(st, job_id=r["job_id"]), r["target"]))
    if as_json:
        out.print_json(json.dumps(views))
        return
    out.print(render.ps_table(views))


def _ps_all(target: Optional[str], as_json: bool, limit: int) -> None:
    """``ps --all TARGET``: the container's journal, newest first; looks only (no
    dead supervisor is restarted by asking)."""
    if target is None:
        raise InputError("ps --all: name the container: gpujob ps --all TARGET")
    t = ctx.target(target)
    jobs_ = t.agent_json("status", "--no-revive")["jobs"]
    jobs_.sort(key=lambda st: st.get("submitted_at") or 0, reverse=True)
    mine = {r["job_id"] for r in ctx.state().jobs(100000) if r["target"] == t.label}
    views = [dict(render.status_view(st, t.label), mine=st.get("job_id") in mine) for st in jobs_[:limit]]
    if as_json:
        out.print_json(json.dumps(views))
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
    res = t.agent_json("stop", job_id, timeout=600)
    if res.get("state"):
        ctx.state().seen(job_id, res["state"])
    if as_json:
        out.print_json(json.dumps(res))
    if res.get("left"):
        err.print(render.lit(f"gpujob: processes of {job_id} still alive: {res['left']}", "red"))
        raise typer.Exit(1)
    if not as_json:
        out.print(render.lit(f"{job_id}: {res['state']}" + (" (it had already ended)" if res.get("already") else "")))


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
    res = t.agent_json("rollback", job_id, *(["--to", to] if to else []),
                       *(["--mark-bad"] if mark_bad else []), timeout=120)
    if as_json:
        out.print_json(json.dumps(dict(res, mark_bad=mark_bad)))
        return
    out.print(render.rollback_line(job_id, res, mark_bad))
    out.print(f"follow it: gpujob logs -f {job_id}")


# ---- profiles / ledger / cache ---------------------------------------------

@ledger_app.command("set")
def ledger_set(target: str = typer.Argument(..., help="container name or host/name"),
               job_name: str = typer.Argument(..., help="the spec's name: each job name has its own ledger"),
               profile: str = typer.Argument(...),
               status_: str = typer.Argument(..., metavar="good|bad|untried", help="untried removes the entry"),
               reason: Optional[str] = typer.Option(None, "--reason", help="why (default: set by hand)"),
               as_json: bool = typer.Option(False, "--json")):
    """Set a profile's ledger entry by hand: good, bad, or untried (forgotten)."""
    import re
    if status_ not in ("good", "bad", "untried"):
        raise InputError(f"expected good, bad or untried, got {status_[:40]!r}")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}(@x[0-9]{1,2}-[0-9a-f]{6})?", job_name):  # @: a fleet's
        raise InputError(f"job name: expected lowercase letters, digits and '-' (at most 40), got {job_name[:50]!r}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", profile):
        raise InputError(f"profile: expected letters, digits, '_', '.' and '-', got {profile[:50]!r}")
    t = ctx.target(target)
    res = t.agent_json("ledger", "set", job_name, profile, status_,
                       *([f"--reason={reason}"] if reason is not None else []))
    if as_json:
        out.print_json(json.dumps(res))
        return
    out.print(render.ledger_set_line(res, t.label))


@app.command()
def profiles(target: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")):
    """Installed profile venvs (size) and the known-good / bad ledger of each job."""
    t = ctx.target(target)
    res = t.agent_json("profiles", timeout=300)
    if as_json:
        out.print_json(json.dumps(res))
        return
    ledgers = res["ledgers"]
    out.print(render.profiles_table(res, t.label))
    for name, led in ledgers.items():
        out.print(render.ledger_table(led.get("profiles", {})), render.lit(f"(job {name})"))


@app.command()
def gc(target: str = typer.Argument(...),
       days: Optional[float] = typer.Option(None, "--days", help="remove venvs not used for this many days"),
       older_than: Optional[float] = typer.Option(None, "--older-than", metavar="DAYS",
                                                  help="remove the directories of jobs that ended this "
                                                       "many days ago (never a live job's)"),
       keep_checkpoints: Optional[int] = typer.Option(None, "--keep-checkpoints", metavar="K",
                                                      help="keep the newest K of each job's checkpoints "
                                                           "(train.checkpoint.path); never a live job's"),
       dry_run: bool = typer.Option(False, "--dry-run", help="say what would go; remove nothing"),
       as_json: bool = typer.Option(False, "--json")):
    """Free disk: old profile venvs, old job directories, old checkpoints (what you ask for)."""
    if days is None and older_than is None and keep_checkpoints is None:
        raise InputError("gc: say what to remove: --days N (venvs), --older-than DAYS (job directories), "
                         "--keep-checkpoints K (checkpoints); --dry-run shows it first")
    for flag, value in (("--days", days), ("--older-than", older_than), ("--keep-checkpoints", keep_checkpoints)):
        if value is not None and value < 0:
            raise InputError(f"{flag}: expected a number >= 0, got {value:g}")
    t = ctx.target(target)
    args = [*(["--days", f"{days:g}"] if days is not None else []),
            *(["--older-than", f"{older_than:g}"] if older_than is not None else []),
            *(["--keep-checkpoints", str(keep_checkpoints)] if keep_checkpoints is not None else []),
            *(["--dry-run"] if dry_run else [])]
    res = t.agent_json("gc", *args, timeout=600)
    if as_json:
        out.print_json(json.dumps(res))
        return
    for table in render.gc_tables(res, t.label):
        out.print(table)
    out.print(render.lit(render.gc_summary(res)), soft_wrap=True)


@cache_app.command("ls")
def cache_ls(target: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")):
    """Live compile caches per profile venv and their snapshots (sizes, ages, proof)."""
    t = ctx.target(target)
    res = t.agent_json("cache", "ls", timeout=300)
    if as_json:
        out.print_json(json.dumps(res))
        return
    out.print(render.cache_table(res["caches"], f"compile caches on {t.label}"))
    out.print(render.snapshot_table(res["caches"], f"snapshots on {t.label}"))
    out.print(f"uv download cache (shared): {render.size(res['uv_cache'])}")


@cache_app.command("clear")
def cache_clear(target: str = typer.Argument(...),
                profile: Optional[str] = typer.Option(None, "--profile", "-p"),
                all_: bool = typer.Option(False, "--all", help="every profile's cache (needed without -p)"),
                snapshots: bool = typer.Option(False, "--snapshots", help="delete the snapshots too"),
                force: bool = typer.Option(False, "--force", help="even under a running job"),
                as_json: bool = typer.Option(False, "--json", help="the agent's answer as one JSON object")):
    """Delete live compile caches (of one profile, or all); snapshots are kept unless --snapshots."""
    if not profile and not all_:
        raise InputError("cache clear: name a profile with -p PROFILE, or pass --all to clear every profile's cache")
    if profile and all_:
        raise InputError("cache clear: -p and --all do not go together")
    t = ctx.target(target)
    res = t.agent_json("cache", "clear", *(["--profile", profile] if profile else []),
                       *(["--snapshots"] if snapshots else []), *(["--force"] if force else []), timeout=300)
    if as_json:
        out.print_json(json.dumps(res))
        return
    for w in res.get("warnings") or []:
        err.print(f"warning: {w}", markup=False, soft_wrap=True)
    out.print(render.lit(f"cleared: {', '.join(res['cleared']) or 'nothing'}"))
    for key, text in sorted((res.get("snapshots_kept") or {}).items()):
        out.print(f"{key}: snapshot kept; {text}", markup=False, soft_wrap=True)
    for key, names in sorted((res.get("snapshots_removed") or {}).items()):
        out.print(f"{key}: snapshots deleted ({len(names)})", markup=False)


@cache_app.command("restore")
def cache_restore(target: str = typer.Argument(...),
                  profile: str = typer.Option(..., "--profile", "-p", help="a profile name or venv key"),
                  as_json: bool = typer.Option(False, "--json", help="the agent's answer as one JSON object")):
    """Restore a profile's live compile cache from its newest snapshot."""
    t = ctx.target(target)
    res = t.agent_json("cache", "restore", "--profile", profile, timeout=1800)
    if as_json:
        out.print_json(json.dumps(res))
        return
    for r in res["restored"]:
        out.print(f"{r['env_key']}: restored {r['text']} in {r['seconds']:.2f}s", markup=False)


@cache_app.command("prove-cold")
def cache_prove_cold(target: str = typer.Argument(...),
                     profile: str = typer.Option(..., "--profile", "-p"),
                     gpus: Optional[str] = typer.Option(None, "--gpus", help="e.g. 4,5 (default: the "
                                                        "warmup's GPUs); no running job may use them"),
                     as_json: bool = typer.Option(False, "--json", help="the agent's answer as one JSON object")):
    """Run a profile's warmup against an empty scratch cache and record whether it works cold."""
    if gpus is not None:
        parts = [g.strip() for g in gpus.split(",")]
        if not parts or not all(g.isdigit() for g in parts):
            raise InputError(f"--gpus: expected comma-separated GPU ids like 0,1, got {gpus!r}")
    t = ctx.target(target)
    res = t.agent_json("cache", "prove-cold", "--profile", profile, *(["--gpus", gpus] if gpus else []),
                       timeout=None)
    if as_json:
        out.print_json(json.dumps(res))
        raise typer.Exit(0 if res["ok"] else 1)
    verdict = "works from a cold cache" if res["ok"] else "FAILED from a cold cache"
    out.print(f"profile {profile}: {verdict} on GPUs {','.join(map(str, res['gpus']))} in "
              f"{res['seconds']:.1f}s: {res['reason']}", markup=False, soft_wrap=True)
    out.print(f"ledger (job {res['name']}): proof {res.get('ledger_proof') or 'none'}; log {res['log']}",
              markup=False, soft_wrap=True)
    if not res["ok"]:
        raise JobError(f"cold start of {profile} failed: {res['reason']}")


# ---- demo ------------------------------------------------------------------

@app.command()
def demo(spec_path: Optional[Path] = typer.Argument(None, metavar="[SPEC]", help="default: the demo "
                                                     "shipped with gpujob (works from any directory)"),
         target: Optional[str] = typer.Option(None, "--target", "-t"),
         as_json: bool = typer.Option(False, "--json", help="JSON Lines: each act's log lines, its final "
                                      "status, then the rollback that happened")):
    """The offline demo: a profile proves itself, then a slow wheel build is rolled back live."""
    from gpujob.demofiles import build_demo_wheels, work_copy
    from gpujob.spec import load_spec
    spec = load_spec(spec_path or work_copy())
    spec_path = spec.source_path if spec_path is None else spec_path
    if spec.multi_node:
        raise InputError(f"{spec_path}: the demo runs on one container; this spec's target is a list "
                         "(a multi-node job: gpujob submit it)")
    build_demo_wheels(spec)
    t = ctx.target(target or spec.target or "demo")
    good = next(p.name for p in spec.profiles if p.name != spec.profile)
    acts = [(good, f"Act 1: the {good} wheel build trains and becomes known-good"),
            (spec.profile, f"Act 2: someone switched to the {spec.profile} build: gpujob notices, "
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
            from gpujob.cli import jsonl
            jsonl.emit({"act": title, "status": render.status_view(final, t.label)})
        if final.get("state") != JobState.SUCCEEDED:
            raise JobError(f"demo job {job_id} ended {final.get('state')}: {final.get('reason')}")
    rolled = [r for r in final.get("rollbacks") or [] if r.get("signal") != "manual"]
    if not rolled:
        raise JobError("the demo ended without a rollback: the slow build was not caught")
    r = rolled[-1]
    if as_json:
        from gpujob.cli import jsonl
        jsonl.emit({"rollback": r})
        return
    render.heading(out, "What happened")
    out.print(render.lit(f"{r['from']} ran below the floor; gpujob decided \"{r['reason']}\", recorded {r['from']} "
              f"bad and had the trainer running on {r['to']} {r['took']:.2f}s later, resumed from "
              f"its checkpoint. Try: gpujob status, gpujob logs --events, gpujob profiles {t.name}"))


def main() -> None:
    try:  # usage errors one line (exit 2), global options after the command too
        code = conventions.run(app, err=lambda line: err.print(render.lit(line), soft_wrap=True))
    except GpujobError as e:
        err.print(render.lit(f"gpujob: {e.message}"), soft_wrap=True)
        if e.hint:
            err.print(render.lit(f"  hint: {e.hint}"), soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("\ninterrupted")
        sys.exit(130)
    finally:
        ctx.close()
    sys.exit(code)


if __name__ == "__main__":
    main()
