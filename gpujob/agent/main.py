"""The agent's command line, run in the container by the controller (stdlib only):

    python3 -c LAUNCHER agent.pyz --home H <command> ...   (protocol.LAUNCHER)

Every command prints JSON (or raw log bytes for ``tail``) and exits 0, or prints
one ``{"error": ...}`` line and exits non-zero: a refusal (``wire.Refused``) carries its code and
exits ``protocol.REFUSED``. Each verb's request and answer are declared in base/wire.py and
described in docs/wire.md; the exit codes are in protocol.py.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gpujob.agent.base import protocol
from gpujob.agent.base.proc import die_here
from gpujob.agent.base.wire import ErrorAnswer, Refused
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.verbs import control, files, ledger, status, submit, tail
from gpujob.agent.verbs.lifecycle import emit, would_revive


REFUSED = protocol.REFUSED


class _Parser(argparse.ArgumentParser):
    """Bad usage is one ``{"error"}`` line (exit 2) like every other failure."""

    def error(self, message: str):
        raise _Usage(f"{self.prog}: {message}")


class _Usage(Exception):
    pass


_PARSER = None  # built once a process (the exec channel's zygote builds it before it forks)


def parser() -> argparse.ArgumentParser:
    global _PARSER
    if _PARSER is None:
        _PARSER = _build_parser()
    return _PARSER


warm = parser  # what the exec channel's zygote runs once after importing this module


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpujob-agent")
    p.add_argument("--home", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("probe")
    s.add_argument("--workdir")
    s = sub.add_parser("put")
    s.add_argument("dest")
    s.add_argument("--mode", default="644")
    s = sub.add_parser("manifest")
    s.add_argument("--name", required=True)
    s.add_argument("--workdir")
    s.add_argument("dests", nargs="*")
    sub.add_parser("submit")
    s = sub.add_parser("run")
    s.add_argument("job")
    s.add_argument("--lock-fd", type=int)
    s.add_argument("--generation", type=int)
    s = sub.add_parser("status")
    s.add_argument("jobs", nargs="*")
    s.add_argument("--no-revive", action="store_true", help="only look: restart no dead supervisor")
    s.add_argument("--missing-ok", action="store_true", help="list unknown ids as not_found")
    s.add_argument("--newest", type=int, default=None, help="without ids: only the N newest jobs (the rest "
                   "counted under more.jobs), so the answer stays bounded however many the container ran")
    s = sub.add_parser("tail")
    s.add_argument("job")
    s.add_argument("--file", default="job.log")
    s.add_argument("--offset", type=int, default=0)
    s.add_argument("--last", type=int)
    s.add_argument("--follow", action="store_true")
    s.add_argument("--poll", type=float, default=0.05)
    s = sub.add_parser("stop")
    s.add_argument("job")
    s.add_argument("--wait", type=float, default=120.0)
    s = sub.add_parser("rollback")
    s.add_argument("job")
    s.add_argument("--to")
    s.add_argument("--reason")
    s.add_argument("--mark-bad", action="store_true", help="also record the profile left bad")
    s = sub.add_parser("ledger")
    s.add_argument("action", choices=["show", "set", "history", "undo", "recover"])
    s.add_argument("name")
    s.add_argument("profile", nargs="?")
    s.add_argument("status", nargs="?", choices=["good", "bad", "untried"])
    s.add_argument("--reason")
    sub.add_parser("profiles")
    sub.add_parser("boot")
    s = sub.add_parser("fleet")
    s.add_argument("action", choices=["ports", "go", "release"])
    s.add_argument("job", nargs="?")
    s.add_argument("--reason")
    s = sub.add_parser("gc")
    s.add_argument("--days", type=float)
    s.add_argument("--older-than", type=float)
    s.add_argument("--keep-checkpoints", type=int)
    s.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("cache")
    s.add_argument("action", choices=["ls", "clear", "restore", "prove-cold"])
    s.add_argument("--profile")
    s.add_argument("--force", action="store_true")
    s.add_argument("--snapshots", action="store_true", help="clear: the snapshots go too")
    s.add_argument("--gpus", help="prove-cold: comma-separated GPU ids")
    return p


#: each verb's function, in agent/verbs/ by role
COMMANDS = {"probe": files.cmd_probe, "put": files.cmd_put, "manifest": files.cmd_manifest,
            "submit": submit.cmd_submit, "status": status.cmd_status, "tail": tail.cmd_tail,
            "stop": control.cmd_stop, "rollback": control.cmd_rollback, "profiles": ledger.cmd_profiles,
            "boot": status.cmd_boot, "ledger": ledger.cmd_ledger}
#: the verbs whose module is imported only when one runs (the exec channel's zygote preloads
#: this module, and a ``status`` never pays for gc's, cache's, fleet's or the supervisor's)
LAZY = {"gc": ("gpujob.agent.verbs.prune", "cmd_gc"), "cache": ("gpujob.agent.verbs.cachecmd", "cmd_cache"),
        "fleet": ("gpujob.agent.verbs.fleetcmd", "cmd_fleet"), "run": ("gpujob.agent.verbs.run", "cmd_run")}


def verb(name: str):
    """The function that runs verb ``name``."""
    if name in LAZY:
        module, function = LAZY[name]
        return getattr(importlib.import_module(module), function)
    return COMMANDS[name]


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        verb(args.cmd)(Home(args.home), args)
    except _Usage as e:
        emit(ErrorAnswer(str(e)))
        return protocol.USAGE
    except Refused as e:  # NewerFormat and a ledger's LedgerError are refusals too, with their codes
        emit(ErrorAnswer.of(e))
        return REFUSED
    except BrokenPipeError:
        return protocol.OK
    except Exception as e:  # every failure is one JSON line, never a traceback
        emit(ErrorAnswer.of(e))
        return protocol.FAILED
    return protocol.OK


#: ``status`` is answered inside the exec channel's server (``answer``) for at most this many ids
ANSWER_MAX_JOBS = 32


def answer(argv: list) -> tuple | None:
    """``status`` with the job ids named, answered in this very process — the exec channel's
    server, which loaded this module once (transport/mux_server.py) — instead of a forked
    child: (exit code, stdout, stderr), exactly what ``main(argv)`` prints. Only when that
    changes nothing: a job whose supervisor would be restarted (``revive``, which spawns a
    process and takes the lock) makes it None, and the caller forks as before; so do bad
    usage and anything but a short ``status``. The server waits while this runs, so it
    reads only the named jobs' small files."""
    import io
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err = io.StringIO(), io.StringIO()
    try:
        try:
            args = parser().parse_args(argv)
        except BaseException:  # noqa: BLE001 - bad usage, --help: the forked way says it
            return None
        if list(argv[2:3]) != ["status"] or args.cmd != "status" or not args.jobs or \
                len(args.jobs) > ANSWER_MAX_JOBS:
            return None
        home = Home(args.home)
        try:
            if not args.no_revive and any(would_revive(home, i) for i in args.jobs
                                          if os.path.exists(Journal(home, i).path("job.json"))):
                return None
        except Exception:  # noqa: BLE001 - a state it cannot read: the forked way says what
            return None
        die_here("status_answer")  # the suite's fault point: the server dies mid-answer
        code = main(list(argv[:3]) + ["--no-revive"] + list(argv[3:]))  # nothing to revive: the same answer
        return code, out.getvalue(), err.getvalue()
    finally:
        sys.stdout, sys.stderr = real


if __name__ == "__main__":
    sys.exit(main())
