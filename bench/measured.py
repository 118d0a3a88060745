"""Is BENCHMARKS.md's table as new as the code it measured?

The figures go through the agent (gpujob/agent/) and the transports (gpujob/transport/).
``bench/measured.json`` records, for every file there, a hash of its code as it was
when the table was last run (or a written reason why a change needs no new run).
``tests/local/test_bench_fresh.py`` recomputes the hashes and fails, naming the files, when
one changed since. It compares content, not commits: a merge or a rebase that leaves
these files as they were never fails it, and comment-only or blank-line edits do not
count (the hash skips blank lines and lines that hold only a comment).

Refresh (the integrator, after a merge that changed a listed file):

    python -m bench --json bench/results.json      # re-run, copy its table into BENCHMARKS.md
    python -m bench.measured --record              # then record what was measured

or, when the change cannot move a figure (say why; the reason is kept in the file):

    python -m bench.measured --record --reason "error text only, no measured path"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEASURED = ("gpujob/agent", "gpujob/transport")
RECORD = REPO / "bench" / "measured.json"


def code_hash(path: Path) -> str:
    """sha256 of a file's lines, without blank lines and comment-only lines."""
    h = hashlib.sha256()
    for line in path.read_bytes().splitlines():
        s = line.strip()
        if s and not s.startswith(b"#"):
            h.update(s + b"\n")
    return h.hexdigest()[:16]


def current() -> dict:
    out = {}
    for top in MEASURED:
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".json") and "__pycache__" not in p.parts:
                out[p.relative_to(REPO).as_posix()] = code_hash(p)
    return out


def stale(recorded: dict) -> list:
    """The measured files whose code differs from the record (or are new, or gone)."""
    now = current()
    was = recorded.get("paths") or {}
    return sorted(p for p in set(now) | set(was) if now.get(p) != was.get(p))


def record(reason: str | None) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except OSError:
        commit = None
    old = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    data = {"recorded_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "reason": reason, "paths": current()}
    if reason:
        data["changed_without_a_run"] = stale(old) if old else None
    RECORD.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.measured", description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="write bench/measured.json for the code as it is")
    ap.add_argument("--reason", help="why the changed files need no new benchmark run")
    args = ap.parse_args(argv)
    if args.record:
        data = record(args.reason)
        print(f"recorded {len(data['paths'])} measured files at {data['commit']}")
        return 0
    changed = stale(json.loads(RECORD.read_text()) if RECORD.exists() else {})
    for p in changed:
        print(p)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
