"""gpujob's console entry point, the top of the house: the few daily commands that can
go through the kept connection are sent to it without importing the full CLI;
everything else (and these, whenever the daemon declines) runs ``gpujob.cli.main``.

Fast here: ``exec TARGET [-n] [--timeout S] -- CMD…``, ``status [JOB] [--json]
[-t TARGET]``, ``ps [TARGET] [--json] [--limit N] [--timeout S]`` (with ``--hosts FILE``
before them), ``disconnect [--all]``,
``--version``, and a shell's Tab (gpujob/complete.py). Stdlib only.
"""

from __future__ import annotations

import os
import re
import sys

_NUMBER = re.compile(r"\d{1,9}(\.\d{1,9})?")


def parse(argv: list[str]) -> dict | None:
    """The request for a command the fast path serves exactly like the full CLI, or None."""
    hosts = None
    if argv[:1] == ["--hosts"] and len(argv) >= 2:
        hosts, argv = argv[1], argv[2:]
    elif argv[:1] and argv[0].startswith("--hosts="):
        hosts, argv = argv[0].split("=", 1)[1], argv[1:]
    if not argv:
        return None
    cmd, rest = argv[0], argv[1:]
    if cmd == "exec":
        req = _exec(rest)
    elif cmd == "status":
        req = _status(rest)
    elif cmd == "ps":
        req = _ps(rest)
    else:
        return None
    if req is not None:
        req["hosts"] = hosts
    return req


def _exec(rest: list[str]) -> dict | None:
    if "--" not in rest:
        return None
    cut = rest.index("--")
    opts, cmd = rest[:cut], rest[cut + 1:]
    if not cmd:
        return None
    target, timeout, no_stdin = None, None, False
    i = 0
    while i < len(opts):
        a = opts[i]
        if a in ("-n", "--no-stdin"):
            no_stdin = True
        elif a == "--timeout" and i + 1 < len(opts) and _NUMBER.fullmatch(opts[i + 1]):
            timeout, i = float(opts[i + 1]), i + 1
        elif a.startswith("--timeout=") and _NUMBER.fullmatch(a[10:]):
            timeout = float(a[10:])
        elif not a.startswith("-") and target is None:
            target = a
        else:
            return None
        i += 1
    if target is None:
        return None
    stdin = not no_stdin and sys.stdin is not None and not os.isatty(0)
    return {"op": "exec", "target": target, "argv": cmd, "timeout": timeout, "stdin": stdin}


def _status(rest: list[str]) -> dict | None:
    job, target, as_json = None, None, False
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--json":
            as_json = True
        elif a in ("-t", "--target") and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            target, i = rest[i + 1], i + 1
        elif a.startswith("--target=") and len(a) > 9:
            target = a[9:]
        elif not a.startswith("-") and job is None:
            job = a
        else:
            return None
        i += 1
    return {"op": "status", "job": job, "target": target, "json": as_json}


def _value(rest: list[str], i: int, name: str, rx: re.Pattern) -> tuple[str | None, int]:
    """``--name V`` or ``--name=V`` at ``rest[i]`` with V matching ``rx``: (V, the next
    index); (None, i) when ``rest[i]`` is not that option or its value is not as expected."""
    a = rest[i]
    if a == name and i + 1 < len(rest) and rx.fullmatch(rest[i + 1]):
        return rest[i + 1], i + 2
    if a.startswith(name + "=") and rx.fullmatch(a[len(name) + 1:]):
        return a[len(name) + 1:], i + 1
    return None, i


_INT = re.compile(r"\d{1,9}")


def _ps(rest: list[str]) -> dict | None:
    """``ps`` without ``--all`` (which reads one container's journal: the full CLI's)."""
    target, as_json, limit, timeout = None, False, 20, None
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--json":
            as_json, i = True, i + 1
            continue
        v, j = _value(rest, i, "--limit", _INT)
        if v is not None:
            limit, i = int(v), j
            continue
        v, j = _value(rest, i, "--timeout", _NUMBER)
        if v is not None and float(v) >= 0.1:  # the CLI's min=0.1
            timeout, i = float(v), j
            continue
        if a.startswith("-") or target is not None:
            return None
        target, i = a, i + 1
    return {"op": "ps", "target": target, "json": as_json, "limit": limit, "timeout": timeout}


def main() -> None:
    argv = sys.argv[1:]
    if os.environ.get("_GPUJOB_COMPLETE"):  # a Tab: answered from the index, without typer
        from gpujob import complete
        try:
            code = complete.main()
        except Exception:  # never a traceback on a Tab: typer's completion answers instead
            code = None
        if code is not None:
            sys.exit(code)
    if argv == ["--version"]:  # answered without importing typer or rich (the full CLI's same line)
        from gpujob import __version__
        print(f"gpujob {__version__}")
        sys.exit(0)
    if argv in (["disconnect"], ["disconnect", "--all"]):
        from gpujob.conn.client import disconnect_line
        print(disconnect_line(argv == ["disconnect", "--all"]))
        sys.exit(0)
    from gpujob.conn import paths
    paths.FROM_ENTRY = True  # the full CLI below may use the kept connection too
    req = None if paths.disabled() else parse(argv)
    if req is not None:
        from gpujob.conn.client import Fallback, request
        try:
            req["inventory"] = paths.find_inventory(req.pop("hosts"))
            if req["inventory"] is not None:  # the built-in inventory is this machine only
                try:
                    sys.exit(request(req))
                except Fallback:
                    if req["op"] != "exec":
                        raise
                # no daemon yet: the daemon's own handler runs it here (not the full CLI)
                try:
                    from gpujob.daemon import oneshot
                    code = oneshot.run(req)
                except KeyboardInterrupt:  # before its Ctrl-C goes to the command: as the full CLI says it
                    sys.stderr.write("\ninterrupted\n")
                    code = 130
                sys.exit(code)
        except (Fallback, paths.NoDaemon):
            pass
    from gpujob.cli.main import main as full
    full()


if __name__ == "__main__":
    main()
