"""The ``gpujob`` CLI's shared parts: the typer apps, the context (inventory,
targets, this laptop's job index), the consoles, and the helpers several commands
use (find a job's target, fetch and print its status, follow its log). The commands
register on ``app`` from their modules (cli/main.py imports them)."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Optional

import typer

from gpujob import __version__
from gpujob.agent.base import wire
from gpujob.agent.base.protocol import FINAL_STATES, JobState
from gpujob.cli import conventions
from gpujob.show import render
from gpujob.ops import bodies
from gpujob.errors import GpujobError, InputError

if TYPE_CHECKING:  # the inventory (pydantic, yaml) and the targets load when a command needs them
    from gpujob.ops.target import Target, Targets

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
            from gpujob.inventory.hosts import find_inventory, load_inventory
            from gpujob.ops.target import Targets
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
                from gpujob.inventory.hosts import load_inventory_data
                from gpujob.ops.target import Targets
                self._recorded[name] = Targets(load_inventory_data(entry), accept_new=self.accept_new)
        return self._recorded[name].open(name)

    def entry(self, t: Target) -> dict | None:
        """The inventory entry that reached ``t``, to record with a job."""
        from gpujob.inventory.hosts import entry_of
        for targets in [self._recorded.get(t.label), self._targets]:
            if targets is not None:
                try:
                    return entry_of(targets.inventory, t.label)
                except InputError:
                    pass
        return None

    def state(self):
        if self._state is None:
            from gpujob.ops.state import State
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
                                              "~/.config/gpujob/hosts.yaml, ./hosts.yaml, built-in local)"),
          accept_new: bool = typer.Option(False, "--accept-new", help="trust and record an unknown host key "
                                          "(like OpenSSH's accept-new); a changed key is always refused"),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="print the version")):
    ctx.hosts = hosts
    ctx.accept_new = accept_new


def job_target(job: Optional[str], target: Optional[str]) -> tuple[str, Target]:
    """(job id, target) of a job this laptop knows, or of JOB on --target."""
    return bodies.job_target(ctx, job, target)


def live_job_target(job: Optional[str], target: Optional[str]) -> tuple[str, Target]:
    """``stop``/``rollback``: a named job, or the one job of this laptop's index not
    ended (as last seen, or as its container says now); else the candidates, exit 2."""
    if job is not None or target:
        return job_target(job, target)
    rows = [r for r in ctx.state().jobs(1000) if r["state"] not in FINAL_STATES]
    by_target: dict[str, list[str]] = {}
    for r in rows:
        by_target.setdefault(r["target"], []).append(r["job_id"])
    fetched: dict[str, str | None] = {}
    for name, ids in by_target.items():
        try:  # look only: no dead supervisor is restarted by asking
            jobs_ = ctx.target(name).ask(wire.StatusAnswer, "status", "--no-revive", "--missing-ok",
                                         *ids).jobs
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


def _fresh_id(name: str) -> str:
    """A new job id this laptop has not used."""
    from gpujob.ops.plan import new_job_id
    while True:
        job_id = new_job_id(name)
        if not ctx.state().known(job_id):
            return job_id


def _print_final(job_id: str, t: Target) -> dict:
    st = _status(job_id, t)
    print_status_view(st, t)
    return st


def print_status_view(st: dict, t: Target) -> None:
    render.print_status(out, render.status_view(st, t.label))


def _status(job_id: str, t: Target) -> dict:
    return bodies.fetch_status(ctx, job_id, t, err)


def _say_revived(st: dict) -> None:
    bodies.say_revived(st, err)


def _follow(job_id: str, t: Target, file: str, last: Optional[int], follow: bool = True,
            events: bool = False, as_json: bool = False) -> None:
    from gpujob.ops.follow import follow_log
    from gpujob.agent.base.jsonl import Splitter, loads
    so = sys.stdout.buffer
    split = Splitter()  # the bounded reader's: a line past its length is never held
    lines = None

    def damaged(n: int) -> None:
        size = f"over {split.max_line} bytes" if n < 0 else f"{n} bytes"
        err.print(render.lit(f"gpujob: skipped a damaged record in {file} ({size})"))
    if as_json:  # JSON Lines: the journal's records as written, or {"line": ...} a log line
        from gpujob.show import jsonl
        lines = jsonl.Lines(events, damaged=damaged)

    def write(chunk: bytes) -> None:
        if not events:
            so.write(chunk)
            so.flush()
            return
        for _n, ln in split.feed(chunk):
            ln = ln.lstrip(b"\0") if ln is not None else None
            if ln is not None and not ln.strip():
                continue
            try:
                rec = loads(ln) if ln is not None else None
            except ValueError:  # a torn record (the writer died mid-line), nested too deep: say so, go on
                rec = None
            if not isinstance(rec, dict) or render.event_error(rec):
                damaged(len(ln) if ln is not None else -1)
                continue
            out.print(render.lit(render.event_line(rec)))

    try:
        follow_log(t, job_id, file=file, follow=follow, last=last, write=lines or write,
                   notice=lambda m: err.print(render.lit(f"gpujob: {m}", "yellow")))
        if lines:
            lines.close()
    except KeyboardInterrupt:
        err.print(f"\ndetached from {job_id}; it keeps running (gpujob logs -f {job_id})")
        raise typer.Exit(130)
