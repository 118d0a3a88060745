"""``ledger`` (show, set, history, undo, recover: what each profile of a job name is known to be) and
``profiles`` (the venvs installed and every ledger). Stdlib only."""

from __future__ import annotations

import os

from gpujob.agent.base import answers, envs
from gpujob.agent.home import gc
from gpujob.agent.home.journal import Home
from gpujob.agent.home import ledgerfile
from gpujob.agent.home.ledger import Ledger, Superseded
from gpujob.agent.home.ledgerfile import LedgerError
from gpujob.agent.base.wire import (JOB_NAME_RULE, LEDGER_NAME, PROFILE_NAME, PROFILE_NAME_RULE, Code,
                                    LedgerAnswer, ProfilesAnswer, Refused)
from gpujob.agent.verbs.lifecycle import emit


def cmd_ledger(home: Home, args) -> None:
    """``ledger show NAME`` (a job name's ledger), ``ledger set NAME PROFILE STATUS`` (by
    hand: good, bad, or untried, which removes the entry), ``history``, ``undo NAME ID``,
    ``recover NAME`` (a damaged ledger put aside, its last good copy restored)."""
    if not LEDGER_NAME.fullmatch(args.name):
        raise Refused(f"job name {args.name!r}: expected {JOB_NAME_RULE}", Code.BAD_REQUEST)
    led = Ledger(home, args.name)
    if args.action == "show":
        emit(LedgerAnswer(args.name, ledger=answers.ledger_view(led.read())))
        return
    if args.action == "history":
        emit(LedgerAnswer.from_dict(answers.cap({"name": args.name, "history": led.history()}, "history",
                                                answers.HISTORY_MAX, newest=True)))
        return
    if args.action == "recover":
        done = led.recover()
        emit(LedgerAnswer.from_dict(dict(done, name=args.name, ledger=answers.ledger_view(led.read()))))
        return
    if args.action == "undo":
        if not args.profile:
            raise Refused("ledger undo needs a verdict id (gpujob ledger history lists them)",
                          Code.BAD_REQUEST)
        try:
            rec = led.undo(args.profile, by_hand=True)
        except KeyError:
            raise Refused(f"no verdict {args.profile!r} in the ledger of {args.name} "
                          f"(gpujob ledger history lists them)", Code.NOT_FOUND) from None
        except Superseded as e:
            h = e.args[0]
            raise Refused(f"verdict {args.profile} of {args.name} is not undone: verdict {h['id']} "
                          f"({h['profile']} {h['status']}, {h.get('reason') or 'no reason'}) came after it "
                          f"on the same profile; undo {h['id']} first, or set {h['profile']} by hand "
                          f"(gpujob ledger set)", Code.CONFLICT) from None
        after = led.read()
        emit(LedgerAnswer(args.name, undone=rec, id=led.last.get("id"), profile=rec["profile"],
                          ledger=answers.ledger_view(after),
                          status=(after["profiles"].get(rec["profile"]) or {}).get("status", "untried")))
        return
    if not args.profile or not args.status:
        raise Refused("ledger set needs a profile and a status (good, bad or untried)", Code.BAD_REQUEST)
    if not PROFILE_NAME.fullmatch(args.profile):
        raise Refused(f"profile {args.profile!r}: expected {PROFILE_NAME_RULE}", Code.BAD_REQUEST)
    reason = args.reason or "set by hand"
    if args.status == "untried":
        res = led.forget(args.profile, reason=reason, by_hand=True)
    else:
        res = led.mark(args.profile, args.status, reason=reason, by_hand=True)
    emit(LedgerAnswer(args.name, profile=args.profile, id=led.last.get("id"),
                      before=(led.last.get("before") or {}).get("status", "untried"), status=args.status,
                      reason=None if args.status == "untried" else reason, ledger=answers.ledger_view(res)))


def cmd_profiles(home: Home, args) -> None:
    installed = []
    root = home.path("envs")
    for key in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if key.startswith("."):
            continue
        marker = envs.read_marker(home.root, key)
        du = gc.disk_usage([os.path.join(root, key)])
        installed.append({"env_key": key, "installed": bool(marker), "profile": marker.get("profile"),
                          "packages": marker.get("packages"), "torch": marker.get("torch"),
                          "size": du["apparent"], "disk": du, "built_at": marker.get("built_at"),
                          "last_used": gc.last_used(os.path.join(root, key), marker)})
    ledgers = {}
    ldir = home.path("ledger")
    for name in sorted(os.listdir(ldir)) if os.path.isdir(ldir) else []:
        if name.endswith(".json"):  # a damaged one: its line, the others as they are
            try:
                ledgers[name[:-5]] = answers.ledger_view(ledgerfile.load(os.path.join(ldir, name)))
            except LedgerError as e:
                ledgers[name[:-5]] = {"error": str(e)}
    total = gc.disk_usage([os.path.join(root, e["env_key"]) for e in installed])
    emit(ProfilesAnswer.from_dict(answers.cap({"envs": installed, "ledgers": ledgers, "disk_total": total},
                                              "envs")))
