"""Turning agent answers into what people read (rich) — no I/O besides the console.

Every piece of text from outside (trainer output, host names, errors from a host,
spec values) reaches rich as a ``Text``, never as markup: ``[/bold]``, ``[rank0]:``
or ``:100:`` print as written. The consoles have markup and emoji off; styles are
given as ``Text`` styles only.
"""

from __future__ import annotations

import shlex
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpujob.agent.judge import timings
from gpujob.agent.base.protocol import ENDED, JobState
from gpujob.agent.base import wire
from gpujob.agent.base.staterec import StateRecord
from gpujob.agent.judge.throughput import fmt_rate, sparkline
from gpujob.show import status_rows, waiting
from gpujob.show.judgeview import rate_pair

S = JobState
STATE_STYLE = {S.SUCCEEDED: "green", S.TRAINING: "cyan", S.WARMUP: "cyan", S.PREPARING: "yellow",
               S.ROLLING_BACK: "magenta", S.STOPPING: "yellow", S.STOPPED: "dim", S.FAILED: "red",
               S.LOST: "red"}


def console(stderr: bool = False) -> Console:
    """A console that never reads markup or emoji codes in what it prints. Piped (not a
    terminal) it never hard-wraps: lines go out whole and tables take their natural width
    (unless $COLUMNS says otherwise), so grep and cut see one record a line."""
    import os
    import sys
    stream = sys.stderr if stderr else sys.stdout
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return Console(stderr=stderr, **console_settings(tty, os.environ))


def console_settings(tty: bool, environ) -> dict:
    """Console()'s arguments for a stream that is (or is not) a terminal under ``environ``:
    the CLI's own consoles and the kept connection's (gpujob/daemon/server.py) are one shape."""
    wide = {} if tty or environ.get("COLUMNS") else {"width": PIPED_WIDTH}
    return dict(highlight=False, markup=False, emoji=False, soft_wrap=not tty, **wide)


PIPED_WIDTH = 1000  # "no limit" for tables when piped; lines are not wrapped at all


def whole(table: Table, *ids: str) -> Table:
    """Nothing in ``table`` is cut with an ellipsis when the terminal is narrow: the ``ids``
    columns (what people copy: job ids, venv keys) keep their width and never wrap, the
    others fold onto more lines."""
    for col in table.columns:
        cells = [c.plain if isinstance(c, Text) else str(c) for c in col._cells]
        if col.header in ids:
            col.no_wrap = True
            col.min_width = max([len(x) for x in cells] + [len(str(col.header))])
        else:
            col.overflow = "fold"
    return table


def heading(con: Console, text: str) -> None:
    """A section title: a rule on a terminal, a plain line when piped."""
    if con.is_terminal:
        con.rule(lit(text, "bold"))
    else:
        con.print(lit(f"== {text} =="))


def lit(value, style: str = "") -> Text:
    """Outside text, shown literally (control characters escaped: one cell, one line)."""
    from gpujob.errors import one_line
    return Text(one_line("" if value is None else str(value)), style=style)


def styled(*parts) -> Text:
    """Text from (text, style) pairs and plain strings, all literal."""
    return Text.assemble(*((lit(p[0], p[1]) if isinstance(p, tuple) else lit(p)) for p in parts))


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(max(s, 0))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d{h}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s")


def uptime(rec: StateRecord, answer: dict) -> float | None:
    """How long the job has run, on the container's clock (the agent says)."""
    up, clock = answer.get("uptime_s"), answer.get("now")
    if isinstance(up, (int, float)):
        return up
    if not rec.started_at or not isinstance(clock, (int, float)):
        return None
    return max(0.0, (rec.finished_at or clock) - rec.started_at)


def exit_info(rec: StateRecord) -> str:
    if rec.state in ENDED:
        bits = []
        if rec.exit_code is not None:
            bits.append(f"exit {rec.exit_code}")
        if rec.signal:
            bits.append(rec.signal)
        if rec.reason:
            bits.append(rec.reason)
        return "; ".join(bits)
    return ""


def status_view(st: dict, target: str) -> dict:
    """The status of one job as plain data (what --json prints, and what the table shows).
    state.json's keys are read through the agent's own record (``StateRecord``: a value of
    another type is left out, never a crash); the status answer's own keys (by, ledger,
    metrics, notify, uptime_s, now) from the answer."""
    rec = StateRecord.from_dict(st)
    window = rec.window or {}
    recent = [v for v in rec.tps_recent or () if isinstance(v, (int, float))]
    ledger = st.get("ledger")
    return {
        "job": rec.job_id, "name": rec.name, "target": target, "by": st.get("by"),
        "state": rec.state, "phase": rec.phase, "profile": rec.profile,
        "tok_s": rec.tps, "window_median": window.get("median"),
        "threshold": window.get("threshold"), "threshold_source": window.get("threshold_source"),
        "consecutive_breaches": window.get("consecutive_breaches"), "breach_for": window.get("breach_for"),
        "failure_limit": window.get("failure_limit"), "verdict": rec.verdict,
        "judging_suspended": rec.judging_suspended, "run_baseline": rec.run_baseline,
        "pauses": rec.pauses or [],  # [start, end] of the latest pauses (saves, evals)
        "baseline": rec.baseline, "trend": recent,
        "sparkline": sparkline(recent, 40) if recent else "",
        "uptime_s": uptime(rec, st), "exit": exit_info(rec), "reason": rec.reason,
        "waiting": waiting.waiting_line(rec, st),
        "exit_code": rec.exit_code, "signal": rec.signal,
        "rollbacks": rec.rollback_list,
        "ledger": (ledger if isinstance(ledger, dict) else {}).get("profiles", {}),
        "ledger_error": ledger.get("error") if isinstance(ledger, dict) else None,  # a damaged one's line
        "metrics": st.get("metrics"),  # the gauges of the metrics textfile (agent/supervisor/metrics.py)
        # its webhook messages: waiting, sent, given_up (agent/supervisor/notify.py)
        "notify": st.get("notify"),
        "suspect": rec.suspect,
    }


def print_status(console: Console, v: dict) -> None:
    style = STATE_STYLE.get(v["state"], "")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("job", lit(f"{v['job']}  on {v['target']}" + (f"  by {v['by']}" if v.get("by") else "")))
    t.add_row("state", styled((v["state"], style), f"  ({v['phase']})" if v["phase"] else ""))
    t.add_row("profile", lit(v["profile"] or "-"))
    label, note = status_rows.rate_label(v)
    if v["tok_s"] is not None:
        line = f"{fmt_rate(v['tok_s'])} tok/s"
        if v["window_median"] is not None and v["threshold"] is not None:
            ok = v["window_median"] >= v["threshold"]
            med, thr = rate_pair(v["window_median"], v["threshold"])
            line += f"   window median {med} {'≥' if ok else '<'} {thr} ({v['threshold_source']})"
            if v["consecutive_breaches"]:
                fl = v["failure_limit"]
                line += (f", breaching for {v['breach_for']:.0f}s (failure_limit {fl}, sooner when deeper)"
                         if isinstance(fl, str) and isinstance(v.get("breach_for"), (int, float))
                         else f", {v['consecutive_breaches']}/{fl} breaches")
        t.add_row(label, lit(line + note))
        t.add_row("trend", styled((v["sparkline"], "cyan"),
                                  f"  {fmt_rate(min(v['trend']))}–{fmt_rate(max(v['trend']))}"))
    for row, text in status_rows.judging_rows(v):
        t.add_row(row, lit(text))
    t.add_row("uptime", duration(v["uptime_s"]))
    if v.get("waiting"):
        t.add_row("waits", styled((v["waiting"], "yellow"), ""))
    if v["exit"]:
        t.add_row("exit", lit(v["exit"]))
    elif v["reason"] and v["state"] == JobState.ROLLING_BACK:
        t.add_row("why", lit(v["reason"]))
    console.print(t)
    if v["rollbacks"]:
        rt = Table(title="rollbacks", title_justify="left", show_edge=False)
        for col in ("when", "from → to", "signal", "reason", "took", "decision →", "resumed"):
            rt.add_column(col)
        for r in v["rollbacks"]:
            rt.add_row(time.strftime("%H:%M:%S", time.localtime(r["decided_at"])),
                       lit(f"{r['from']} → {r['to']}"), lit(r.get("signal", "")), lit(r.get("reason", "")),
                       f"{r['took']:.2f}s" if r.get("took") is not None else "-",
                       lit(timings.describe(r)), lit(r.get("resumed") or "-"))
        console.print(whole(rt, "from → to"))
    if v["ledger"]:
        console.print(ledger_table(v["ledger"]))
    if v["ledger_error"]:
        console.print(lit(str(v["ledger_error"]), "red"))


def ledger_table(ledger: dict) -> Table:
    lt = Table(title="profiles (ledger)", title_justify="left", show_edge=False)
    for col in ("profile", "status", "baseline", "proof", "reason"):
        lt.add_column(col)
    colour = {"good": "green", "bad": "red"}
    for name, e in sorted(ledger.items()):
        lt.add_row(lit(name), lit(e.get("status"), colour.get(e.get("status"), "")),
                   fmt_rate(e["baseline"]) + " tok/s" if e.get("baseline") else "-",
                   lit((e.get("proof") or "-") + (" (warm only)" if e.get("proof") == "warm" else ""))
                   if e.get("status") == "good" else "-",
                   lit(e.get("reason") or ""))
    return whole(lt, "profile")


def disk(d: dict) -> str:
    """own / real / apparent bytes of a venv (what removing it frees / each file once / sum of sizes)."""
    return " / ".join(size(d.get(k)) for k in ("own", "real", "apparent"))


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


#: the fields event_line reads as numbers or lists, by kind (an events file from outside may hold others)
EVENT_FIELDS = {"": {"t": "number"}, "sample": {"value": "number", "step": "?number"},
                "samples_1m": {"median": "number", "min": "number", "max": "number"},
                "stacks": {"stacks": "?list"}}


def event_error(ev: dict):
    """What is wrong with an events record's fields for ``event_line`` (None when nothing)."""
    from gpujob.agent.base.jsonl import field_error
    kind = ev.get("type")
    return field_error(ev, EVENT_FIELDS[""]) or (field_error(ev, EVENT_FIELDS[kind])
                                                 if isinstance(kind, str) and kind in EVENT_FIELDS else None)


def event_line(ev: dict) -> str:
    """One events.jsonl record as a readable line (its fields checked against EVENT_FIELDS first)."""
    t = time.strftime("%H:%M:%S", time.localtime(ev.get("t", 0)))
    kind = ev.get("type", "?")
    skip = {"t", "type", "evidence", "argv"}
    if kind == "sample":
        body = (f"{fmt_rate(ev['value'])} tok/s"
                + (f" step {ev['step']}" if ev.get("step") is not None else "") + f" [{ev.get('verdict')}]")
    elif kind == "samples_1m":
        body = (f"{fmt_rate(ev['median'])} tok/s median of {ev.get('n')} samples "
                f"({fmt_rate(ev['min'])}–{fmt_rate(ev['max'])}) on {ev.get('profile')} [{ev.get('verdict')}]")
    elif kind == "stacks":  # the text itself: gpujob logs --stacks
        n = len(ev.get("stacks") or [])
        body = (f"{ev.get('method')}: {n} process{'es' if n != 1 else ''} of {ev.get('phase')} "
                f"({ev.get('signal')}); gpujob logs --stacks shows them")
    elif kind in ("decision", "rollback"):
        body = ", ".join(f"{k}={ev[k]}" for k in ("verdict", "from", "to", "signal") if k in ev)
        body += f": {ev.get('reason', '')}"
    else:
        body = " ".join(f"{k}={ev[k]}" for k in sorted(ev) if k not in skip)
    return f"{t} {kind:<14} {body}"


def hosts_table(rows: list[dict], source: str) -> Table:
    table = Table(title=f"targets ({source})", title_justify="left")
    for col in ("target", "vmid", "status", "running job"):
        table.add_column(col)
    for r in rows:
        st = r["status"]
        colour = "green" if st in ("running", "local") else "red" if st == "unreachable" else "yellow"
        table.add_row(lit(f"{r['host']}/{r['container']}"), lit(r.get("vmid") or "-"),
                      styled((st, colour), f" ({r['error']})" if r.get("error") else ""),
                      lit(r.get("job") or "-"))
    return whole(table, "target", "running job")


def ps_table(views: list[dict], by: bool = False) -> Table:
    """``ps``; with ``by`` (``ps --all``) a column of who submitted each job (user@laptop)."""
    table = Table(show_edge=False)
    for col in ("job", "target") + (("by",) if by else ()) + ("state", "phase", "profile", "tok/s", "uptime"):
        table.add_column(col)
    table.add_column("exit", ratio=1)
    for v in views:
        style = STATE_STYLE.get(v["state"], "red" if v["state"] == "unreachable" else "")
        exit_ = v["exit"] or (v.get("reason") or "" if v["state"] == "unreachable" else "")
        who = [lit((v.get("by") or "?") + (" (you)" if v.get("mine") else ""))] if by else []
        table.add_row(lit(v["job"]), lit(v["target"]), *who, lit(v["state"] or "-", style),
                      lit(v["phase"] or "-"), lit(v["profile"] or "-"),
                      fmt_rate(v["tok_s"]) if v["tok_s"] else "-", duration(v["uptime_s"]), lit(exit_))
    return whole(table, "job")  # the id is what people copy


def doctor_table(label: str, checks) -> Table:
    table = Table(title=f"gpujob doctor: {label}", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    table.add_column("fix", overflow="fold", ratio=1)
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    for c in checks:
        table.add_row(lit(c.name), lit(c.status, colour.get(c.status, "")), lit(c.detail), lit(c.hint))
    return whole(table, "check", "status")


def doctor_summary(counts: dict) -> Text:
    """doctor's last line: ``N ok, N warn, N fail``, coloured by the worst."""
    colour = "red" if counts.get("fail") else "yellow" if counts.get("warn") else "green"
    return lit(", ".join(f"{counts.get(k, 0)} {k}" for k in ("ok", "warn", "fail")), colour)


def plan_lines(header: str, steps) -> list[Text]:
    """``submit --plan``: a header, then each step and its exact argv (shell-quoted)."""
    lines = [styled(("plan", "bold"), header)]
    for i, step in enumerate(steps, 1):
        lines.append(styled(f"{i:>2}. ", (step.kind, "bold"), f" [{step.where}] {step.what}",
                            (f" ({step.when})" if step.when else "", "dim")))
        if step.argv:
            lines.append(lit(f"      $ {shlex.join(step.argv)}"))
    return lines


def profiles_table(res: dict, label: str) -> Table:
    """The agent's ``profiles`` answer: venvs and, per profile, its status in each job's ledger."""
    status: dict = {}
    for name, led in res["ledgers"].items():  # a damaged one ({"error"}) has none: said below the table
        for p, e in (led.get("profiles") or {}).items():
            status.setdefault(p, []).append(f"{name}: {e.get('status')}")
    table = Table(title=f"profiles on {label}", title_justify="left", show_edge=False)
    for col in ("profile", "venv", "installed", "disk: own / real / apparent", "packages", "ledger"):
        table.add_column(col)
    seen = set()
    for e in res["envs"]:
        seen.add(e["profile"])
        pk = ", ".join(f"{k}=={v}" for k, v in (e.get("packages") or {}).items())
        table.add_row(lit(e["profile"] or "?"), lit(e["env_key"]), "yes" if e["installed"] else "partial",
                      disk(e.get("disk") or {"apparent": e["size"]}), lit(pk),
                      lit("; ".join(status.get(e["profile"], [])) or "untried"))
    for p in sorted(set(status) - seen):
        table.add_row(lit(p), "-", "no", "-", "", lit("; ".join(status[p])))
    if res.get("disk_total"):
        table.caption = (f"all venvs together: {disk(res['disk_total'])} (own: only in these venvs; "
                         "real: each file once; uv links the rest from its cache)")
    return whole(table, "profile", "venv")


def age(seconds) -> str:
    return "-" if seconds is None else f"{duration(seconds)} ago"


def cache_table(caches: list, title: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for col in ("profile venv", "total", "files", "inductor", "triton", "torch_extensions", "newest file",
                "proof"):
        table.add_column(col)
    for c in caches:
        if not c.get("live", True):
            table.add_row(lit(c["env_key"]), "cleared", "0", "-", "-", "-", "-", lit(", ".join(c["proof"])))
            continue
        table.add_row(lit(c["env_key"]), size(c["size"]), str(c.get("files", "?")),
                      *(size(c["parts"][k]) for k in ("inductor", "triton", "torch_extensions")),
                      age(c.get("age")), lit(", ".join(c.get("proof") or []) or "-"))
    return whole(table, "profile venv")


def snapshot_table(caches: list, title: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for col in ("profile venv", "snapshot", "age", "files", "size", "hard links", "job"):
        table.add_column(col)
    for c in caches:
        for s in c.get("snapshots") or []:
            table.add_row(lit(c["env_key"]), lit(s["name"]), age(s["age"]), str(s["files"]),
                          size(s["bytes"]), str(s.get("linked")), lit(str(s.get("job") or "-")))
    return whole(table, "profile venv", "snapshot", "job")


def candidates_line(cands: list) -> str:
    """``stop``/``rollback`` without an id when not exactly one job could be meant."""
    if not cands:
        return ("no job could be meant: none of this laptop's jobs is still running; name one (gpujob ps "
                "lists them)")
    return ("more than one job could be meant: "
            + ", ".join(f"{job_id} ({target}, {state})" for job_id, target, state in cands) + "; name one")


def bad_profile_refusal(profile: str, name: str, target: str, entry: dict, target_name: str) -> str:
    """``submit`` onto a profile the ledger marks bad: one line, with the ways on."""
    return (f"profile {profile} is marked bad in the ledger of {name} on {target}: "
            f"{entry.get('reason') or 'no reason recorded'}; start it anyway with --force, pick another with "
            f"-p, or clear the mark: gpujob ledger set {target_name} {name} {profile} untried")


def rollback_line(job_id: str, res: wire.RollbackAnswer, mark_bad: bool) -> Text:
    judged = f"; {res.from_} recorded bad" if mark_bad else f"; {res.from_} is not judged (--mark-bad would)"
    if res.requested:
        to = f" (to {res.to})" if res.to else " (to the last known-good profile)"
        return lit(f"{job_id}: rollback from {res.from_} asked of its supervisor{to}{judged}")
    was = f"had ended ({res.was}): it runs again, " if res.was else ""
    return lit(f"{job_id}: {was}restarted on {res.to} (was {res.from_}), supervisor pid "
               f"{res.supervisor_pid}{judged}")


def dropped_stop_lines(job_id: str, res: wire.RollbackAnswer) -> list:
    """A stop queued for an earlier run, whose supervisor died before acting on it: this
    rollback superseded it (one line each)."""
    out = []
    for d in res.dropped_stops or []:
        t = d.get("asked_at") if isinstance(d, dict) else None
        when = time.strftime("%H:%M:%S UTC", time.gmtime(t)) if isinstance(t, (int, float)) else "earlier"
        out.append(lit(f"{job_id}: a stop asked at {when} was never carried out (its supervisor died before "
                       f"acting on it); this rollback supersedes it: the stop was dropped "
                       f"(`gpujob stop {job_id}` stops the job)", "yellow"))
    return out


def ledger_set_line(res: wire.LedgerAnswer, label: str) -> Text:
    why = f" ({res.reason})" if res.reason else ""
    return lit(f"ledger of {res.name} on {label}: {res.profile} {res.before} -> {res.status}{why}")


def gc_tables(res: dict, label: str) -> list:
    """``gc``: one table per kind of thing it looked at (venvs, job directories, checkpoints)."""
    dry = res.get("dry_run")

    def decision(e: dict) -> Text:
        if e["why"] == "remove":
            return lit("removed" if e["removed"] else "would remove")
        return lit(f"kept: {e['why']}")
    dry_note = ", dry run" if dry else ""

    def table(title: str, columns: tuple, rows) -> Table:
        t = Table(title=f"{title}{dry_note})", title_justify="left", show_edge=False)
        for col in columns:
            t.add_column(col)
        for row in rows:
            t.add_row(*row)
        return whole(t, columns[0])
    tables = []
    if res.get("days") is not None:
        tables.append(table(f"venvs on {label} (unused for {res['days']:g} days",
                            ("venv", "profile", "disk: own / real / apparent", "decision"),
                            ((lit(e["env_key"]), lit(e.get("profile") or "?"), disk(e["disk"]), decision(e))
                             for e in res["envs"])))
    if res.get("older_than") is not None:
        tables.append(table(f"job directories on {label} (ended {res['older_than']:g}+ days ago",
                            ("job", "state", "size", "decision"),
                            ((lit(e["job_id"]), lit(e.get("state") or "-"), size(e["bytes"]), decision(e))
                             for e in res["jobs"])))
    if res.get("keep_checkpoints") is not None:
        tables.append(table(f"checkpoints on {label} (newest {res['keep_checkpoints']} kept",
                            ("checkpoint", "size", "decision"),
                            ((lit(e["path"]), size(e["bytes"]), decision(e)) for e in res["checkpoints"])))
    return tables


def gc_summary(res: dict) -> str:
    freed = res.get("freed")  # over every row (an answer lists at most a few hundred: agent/base/answers.py)
    if freed is None:  # an older agent's answer: every row is in it
        freed = sum(e["disk"]["own"] for e in res.get("envs") or [] if e["why"] == "remove")
        freed += sum(e["bytes"] for e in (res.get("jobs") or []) + (res.get("checkpoints") or [])
                     if e["why"] == "remove")
    text = f"{'would free' if res.get('dry_run') else 'freed'} {size(freed)}"
    if res.get("finished"):
        n = len(res['finished']) + (res.get('more') or {}).get('finished', 0)
        text += f"; finished {n} removal(s) a killed gc had left"
    return text + more_note(res, {"envs": "venvs", "jobs": "job directories", "checkpoints": "checkpoints"})


def more_note(res: dict, names: dict) -> str:
    """``; N more checkpoints not listed (of M, K removed)`` for each listing an answer cut."""
    more, counts = res.get("more") or {}, res.get("counts") or {}
    text = ""
    for key, name in names.items():
        if more.get(key):
            c = counts.get(key) or {}
            of = f" (of {c['all']}, {c['remove']} {'to remove' if res.get('dry_run') else 'removed'})" \
                if c.get("all") is not None else ""
            text += f"; {more[key]} more {name} not listed{of}"
    return text


def ledger_history_line(h: dict) -> str:
    """One verdict of `gpujob ledger history`: id, time, profile, status, evidence."""
    import time as _time
    when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.gmtime(h["time"])) if h.get("time") else "?"
    bits = [f"{h['id']}", when, f"{h['profile']}={h.get('status')}"]
    if h.get("legacy"):
        bits.append("(legacy: by an older gpujob, evidence as it kept it)")
    for key in ("baseline", "threshold"):
        if h.get(key) is not None:
            bits.append(f"{key} {h[key]:.0f}")
    if h.get("window_medians"):
        bits.append("medians " + ",".join(f"{m:.0f}" for m in h["window_medians"]))
    if h.get("job"):
        bits.append(f"job {h['job']}")
    if h.get("reason"):
        bits.append(f"- {h['reason']}")
    return "  ".join(bits)
