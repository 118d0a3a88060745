"""``gpujob ledger set``, ``profiles``, ``gc``, ``cache ...``: profiles, the ledger and the caches."""

from __future__ import annotations

import json
from typing import Optional

import typer

from gpujob.agent.base import wire
from gpujob.show import render
from gpujob.errors import InputError, JobError
from gpujob.cli.app import app, cache_app, ctx, err, ledger_app, out


@ledger_app.command("set")
def ledger_set(target: str = typer.Argument(..., help="container name or host/name"),
               job_name: str = typer.Argument(..., help="the spec's name: each job name has its own ledger"),
               profile: str = typer.Argument(...),
               status_: str = typer.Argument(..., metavar="good|bad|untried",
                                             help="untried removes the entry"),
               reason: Optional[str] = typer.Option(None, "--reason", help="why (default: set by hand)"),
               as_json: bool = typer.Option(False, "--json")):
    """Set a profile's ledger entry by hand: good, bad, or untried (forgotten)."""
    if status_ not in ("good", "bad", "untried"):
        raise InputError(f"expected good, bad or untried, got {status_[:40]!r}")
    if not wire.LEDGER_NAME.fullmatch(job_name):  # @: a fleet's
        raise InputError(f"job name: expected {wire.JOB_NAME_RULE}, got {job_name[:50]!r}")
    if not wire.PROFILE_NAME.fullmatch(profile):
        raise InputError(f"profile: expected {wire.PROFILE_NAME_RULE}, got {profile[:50]!r}")
    t = ctx.target(target)
    res = t.ask(wire.LedgerAnswer, "ledger", "set", job_name, profile, status_,
                *([f"--reason={reason}"] if reason is not None else []))
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    out.print(render.ledger_set_line(res, t.label))


def _ledger_name(job_name: str) -> str:
    if not wire.LEDGER_NAME.fullmatch(job_name):  # @: a fleet's
        raise InputError(f"job name: expected {wire.JOB_NAME_RULE}, or a "
                         f"multi-node ledger's name as status shows it (NAME@xN-hhhhhh), got "
                         f"{job_name[:50]!r}")
    return job_name


@ledger_app.command("history")
def ledger_history(target: str = typer.Argument(..., help="container name or host/name"),
                   job_name: str = typer.Argument(..., help="the job name (a multi-node job's as status "
                                                            "shows it)"),
                   as_json: bool = typer.Option(False, "--json")):
    """The verdicts of a job name's ledger (the newest 500), oldest first, with their ids and evidence."""
    t = ctx.target(target)
    res = t.ask(wire.LedgerAnswer, "ledger", "history", _ledger_name(job_name))
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    more = (res.extra.get("more") or {}).get("history")
    if more:  # the agent lists the newest (agent/base/answers.py HISTORY_MAX)
        out.print(render.lit(f"({more} older verdicts not listed)"))
    for h in res.history or []:
        out.print(render.lit(render.ledger_history_line(h)))


@ledger_app.command("undo")
def ledger_undo(target: str = typer.Argument(..., help="container name or host/name"),
                job_name: str = typer.Argument(...),
                verdict_id: str = typer.Argument(..., metavar="ID", help="from gpujob ledger history"),
                as_json: bool = typer.Option(False, "--json")):
    """Revert one verdict: the profile's entry as it was before it, baseline included."""
    import re
    if not re.fullmatch(r"[0-9]{1,9}|legacy-[A-Za-z0-9][A-Za-z0-9_.-]*", verdict_id):
        raise InputError(f"ID: expected a number or legacy-PROFILE from gpujob ledger history, got "
                         f"{verdict_id[:50]!r}")
    t = ctx.target(target)
    res = t.ask(wire.LedgerAnswer, "ledger", "undo", _ledger_name(job_name), verdict_id)
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    undone = (res.undone or {}).get("id")
    out.print(render.lit(f"verdict {undone} undone: {res.profile} is {res.status} again "
                         f"in the ledger of {res.name} on {t.label}"))


@ledger_app.command("recover")
def ledger_recover(target: str = typer.Argument(..., help="container name or host/name"),
                   job_name: str = typer.Argument(..., help="the job name (a multi-node job's as status "
                                                            "shows it)"),
                   as_json: bool = typer.Option(False, "--json")):
    """A damaged ledger put aside (kept as NAME.json.damaged-TIME) and its last good copy restored."""
    t = ctx.target(target)
    res = t.ask(wire.LedgerAnswer, "ledger", "recover", _ledger_name(job_name)).to_dict()
    if as_json:
        out.print_json(json.dumps(res))
        return
    src = (f"its last good copy ({res['restored_from']}, {res['verdicts']} verdicts)"
           if res.get("restored_from") else "an empty ledger (no good copy was found)")
    out.print(render.lit(f"ledger of {res['name']} on {t.label}: {res['problem']}; kept as {res['kept_as']}; "
                         f"restored {src}; the next verdict id is {res['next_id']}"))


@app.command()
def profiles(target: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")):
    """Installed profile venvs (size) and the known-good / bad ledger of each job."""
    t = ctx.target(target)
    res = t.ask(wire.ProfilesAnswer, "profiles", timeout=300)
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    ledgers = res.ledgers
    out.print(render.profiles_table(res.to_dict(), t.label))
    for name, led in ledgers.items():
        if "error" in led:  # a damaged ledger: its line; the others' tables as ever
            err.print(render.lit(str(led["error"])))
            continue
        out.print(render.ledger_table(led.get("profiles", {})), render.lit(f"(job {name})"))


@app.command()
def gc(target: str = typer.Argument(...),
       days: Optional[float] = typer.Option(None, "--days", help="remove venvs not used for this many days"),
       older_than: Optional[float] = typer.Option(None, "--older-than", metavar="DAYS",
                                                  help="remove the directories of jobs that ended this "
                                                       "many days ago (never a live job's)"),
       keep_checkpoints: Optional[int] = typer.Option(None, "--keep-checkpoints", metavar="K",
                                                      help="keep the newest K checkpoints of each job; only "
                                                           "files its runs wrote go (the checkpoint "
                                                           "register), never a live job's"),
       dry_run: bool = typer.Option(False, "--dry-run", help="say what would go; remove nothing"),
       as_json: bool = typer.Option(False, "--json")):
    """Free disk: old profile venvs, old job directories, old checkpoints (what you ask for)."""
    if days is None and older_than is None and keep_checkpoints is None:
        raise InputError("gc: say what to remove: --days N (venvs), --older-than DAYS (job directories), "
                         "--keep-checkpoints K (checkpoints); --dry-run shows it first")
    for flag, value in (("--days", days), ("--older-than", older_than),
                        ("--keep-checkpoints", keep_checkpoints)):
        if value is not None and value < 0:
            raise InputError(f"{flag}: expected a number >= 0, got {value:g}")
    t = ctx.target(target)
    args = [*(["--days", f"{days:g}"] if days is not None else []),
            *(["--older-than", f"{older_than:g}"] if older_than is not None else []),
            *(["--keep-checkpoints", str(keep_checkpoints)] if keep_checkpoints is not None else []),
            *(["--dry-run"] if dry_run else [])]
    res = t.ask(wire.GcAnswer, "gc", *args, timeout=600).to_dict()  # the tables read it whole
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
    res = t.ask(wire.CacheAnswer, "cache", "ls", timeout=300)
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    caches = res.caches or []
    out.print(render.cache_table(caches, f"compile caches on {t.label}"))
    out.print(render.snapshot_table(caches, f"snapshots on {t.label}"))
    for c in caches:  # the agent lists a bounded number (agent/base/answers.py)
        if (c.get("more") or {}).get("snapshots"):
            out.print(render.lit(f"{c['env_key']}: {c['more']['snapshots']} older snapshots not listed"))
    if (res.extra.get("more") or {}).get("caches"):
        out.print(render.lit(f"{res.extra['more']['caches']} more caches not listed"))
    out.print(f"uv download cache (shared): {render.size(res.uv_cache or 0)}")


@cache_app.command("clear")
def cache_clear(target: str = typer.Argument(...),
                profile: Optional[str] = typer.Option(None, "--profile", "-p"),
                all_: bool = typer.Option(False, "--all", help="every profile's cache (needed without -p)"),
                snapshots: bool = typer.Option(False, "--snapshots", help="delete the snapshots too"),
                force: bool = typer.Option(False, "--force", help="even under a running job"),
                as_json: bool = typer.Option(False, "--json", help="the agent's answer as one JSON object")):
    """Delete live compile caches (of one profile, or all); snapshots are kept unless --snapshots."""
    if not profile and not all_:
        raise InputError("cache clear: name a profile with -p PROFILE, or pass --all to clear every "
                         "profile's cache")
    if profile and all_:
        raise InputError("cache clear: -p and --all do not go together")
    t = ctx.target(target)
    res = t.ask(wire.CacheAnswer, "cache", "clear", *(["--profile", profile] if profile else []),
                *(["--snapshots"] if snapshots else []), *(["--force"] if force else []), timeout=300)
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    for w in res.warnings or []:
        err.print(f"warning: {w}", markup=False, soft_wrap=True)
    out.print(render.lit(f"cleared: {', '.join(res.cleared or []) or 'nothing'}"))
    for key, text in sorted((res.snapshots_kept or {}).items()):
        out.print(f"{key}: snapshot kept; {text}", markup=False, soft_wrap=True)
    for key, names in sorted((res.snapshots_removed or {}).items()):
        out.print(f"{key}: snapshots deleted ({len(names)})", markup=False)


@cache_app.command("restore")
def cache_restore(target: str = typer.Argument(...),
                  profile: str = typer.Option(..., "--profile", "-p", help="a profile name or venv key"),
                  as_json: bool = typer.Option(False, "--json",
                                               help="the agent's answer as one JSON object")):
    """Restore a profile's live compile cache from its newest snapshot."""
    t = ctx.target(target)
    res = t.ask(wire.CacheAnswer, "cache", "restore", "--profile", profile, timeout=1800)
    if as_json:
        out.print_json(json.dumps(res.to_dict()))
        return
    for r in res.restored or []:
        out.print(f"{r['env_key']}: restored {r['text']} in {r['seconds']:.2f}s", markup=False)


@cache_app.command("prove-cold")
def cache_prove_cold(target: str = typer.Argument(...),
                     profile: str = typer.Option(..., "--profile", "-p"),
                     gpus: Optional[str] = typer.Option(None, "--gpus", help="e.g. 4,5 (default: the "
                                                        "warmup's GPUs); no running job may use them"),
                     as_json: bool = typer.Option(False, "--json",
                                                  help="the agent's answer as one JSON object")):
    """Run a profile's warmup against an empty scratch cache and record whether it works cold."""
    if gpus is not None:
        parts = [g.strip() for g in gpus.split(",")]
        if not parts or not all(g.isdigit() for g in parts):
            raise InputError(f"--gpus: expected comma-separated GPU ids like 0,1, got {gpus!r}")
    t = ctx.target(target)
    res = t.ask(wire.CacheAnswer, "cache", "prove-cold", "--profile", profile,
                *(["--gpus", gpus] if gpus else []), timeout=None).to_dict()  # the proof the ledger records
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
