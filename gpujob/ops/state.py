"""The laptop's small index of jobs (SQLite under $XDG_STATE_HOME/gpujob).

The container's journal is the source of truth; this file only remembers which
jobs this laptop started, where, from which spec, and the last state and ledger
seen, so ``gpujob logs`` and ``status`` work without an id and after a restart.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from gpujob.agent.base.proc import is_alive, start_ticks
from gpujob.errors import JobError

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    target TEXT NOT NULL,
    spec_path TEXT,
    spec_hash TEXT,
    profile TEXT,
    submitted_at REAL NOT NULL,
    state TEXT,
    seen_at REAL
);
CREATE TABLE IF NOT EXISTS nodes (
    job_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS ledger (
    target TEXT NOT NULL,
    job_name TEXT NOT NULL,
    profile TEXT NOT NULL,
    status TEXT NOT NULL,
    baseline REAL,
    reason TEXT,
    at REAL,
    PRIMARY KEY (target, job_name, profile)
);
"""


def _like(text: str) -> str:
    """``text`` as a literal LIKE prefix (``%`` and ``_`` are not wildcards)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "gpujob"


class State:
    def __init__(self, path: Path | None = None):
        self.path = path or state_dir() / "state.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), timeout=10, check_same_thread=False)  # callers serialise
        self.db.row_factory = sqlite3.Row
        self.db.executescript(SCHEMA)
        cols = {r["name"] for r in self.db.execute("PRAGMA table_info(jobs)")}
        for col in ("entry", "submitter", "asked"):  # an index from before: its jobs have none recorded
            if col in cols:
                continue
            try:
                with self.db:
                    self.db.execute(f"ALTER TABLE jobs ADD COLUMN {col} TEXT")
            except sqlite3.OperationalError as e:  # another gpujob added it at the same moment
                if "duplicate column" not in str(e):
                    raise

    def close(self) -> None:
        self.db.close()

    def reserve(self, job_id: str, name: str, target: str, spec_path: str, spec_hash: str,
                profile: str, entry: dict | None = None) -> None:
        """Record a job about to be submitted, before anything starts remotely; a job
        id this laptop already knows is refused (ids are unique in the index).
        ``entry``: the inventory entry that reaches its target (one host, one
        container), so the job is found again from a directory with another inventory."""
        try:
            with self.db:
                self.db.execute(
                    "INSERT INTO jobs (job_id, name, target, spec_path, spec_hash, profile, submitted_at,"
                    " state, entry, submitter) VALUES (?, ?, ?, ?, ?, ?, ?, 'submitting', ?, ?)",
                    (job_id, name, target, spec_path, spec_hash, profile, time.time(),
                     json.dumps(entry) if entry else None, f"{os.getpid()}:{start_ticks(os.getpid())}"))
        except sqlite3.IntegrityError:
            row = self.db.execute("SELECT target FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            raise JobError(f"job id {job_id} is already taken on this laptop (a job on "
                           f"{row['target'] if row else '?'}); nothing was started") from None

    def set_nodes(self, job_id: str, targets: list) -> None:
        """A multi-node job's containers, node 0 first (its jobs row names node 0)."""
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?)",
                                [(job_id, rank, t) for rank, t in enumerate(targets)])

    def nodes(self, job_id: str) -> list:
        """A multi-node job's containers in rank order; [] for a one-node job."""
        return [r["target"] for r in self.db.execute(
            "SELECT target FROM nodes WHERE job_id = ? ORDER BY rank", (job_id,))]

    def asking(self, job_id: str) -> None:
        """The submit asks the container to start the job now: from here a row whose submit
        died may be a real job (Tab completion offers it); before, it is a phantom."""
        with self.db:
            self.db.execute("UPDATE jobs SET asked = ? WHERE job_id = ? AND state = 'submitting'",
                            (str(time.time()), job_id))

    def unreserve(self, job_id: str) -> None:
        """The submit failed before the job started: forget it."""
        with self.db:
            gone = self.db.execute("DELETE FROM jobs WHERE job_id = ? AND state = 'submitting'", (job_id,))
            if gone.rowcount:
                self.db.execute("DELETE FROM nodes WHERE job_id = ?", (job_id,))

    @staticmethod
    def abandoned(row: sqlite3.Row) -> int | None:
        """The pid of the gpujob that reserved ``row`` and ended (killed) before the
        submit's answer was recorded; None while it lives, or once the row has a state."""
        if row["state"] != "submitting" or not row["submitter"]:
            return None
        pid, _, ticks = row["submitter"].partition(":")
        if not pid.isdigit() or is_alive(int(pid), int(ticks) if ticks.isdigit() else None):
            return None
        return int(pid)

    def known(self, job_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is not None

    def job(self, job_id: str | None) -> sqlite3.Row:
        """A job by id (or unique id prefix); None → the most recent job, in the order
        this laptop recorded them (never by a clock, which can step back)."""
        if job_id is None:
            row = self.db.execute("SELECT * FROM jobs ORDER BY rowid DESC LIMIT 1").fetchone()
            if row is None:
                raise JobError("no jobs yet: submit one with `gpujob submit SPEC`")
            return row
        rows = self.db.execute("SELECT * FROM jobs WHERE job_id = ? OR job_id LIKE ? ESCAPE '\\' "
                               "ORDER BY rowid DESC", (job_id, _like(job_id) + "%")).fetchall()
        exact = [r for r in rows if r["job_id"] == job_id]
        if exact:
            return exact[0]
        if len(rows) == 1:
            return rows[0]
        if not rows:
            raise JobError(f"no job {job_id!r} on this laptop; `gpujob ps` lists them")
        raise JobError(f"{job_id!r} matches {len(rows)} jobs: "
                       f"{', '.join(r['job_id'] for r in rows[:5])}")

    def entry(self, target: str) -> dict | None:
        """The inventory entry recorded with the newest job on ``target`` (host/name)."""
        row = self.db.execute("SELECT entry FROM jobs WHERE target = ? AND entry IS NOT NULL "
                              "ORDER BY rowid DESC LIMIT 1", (target,)).fetchone()
        return json.loads(row["entry"]) if row else None

    def jobs(self, limit: int = 50) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM jobs ORDER BY rowid DESC LIMIT ?",
                               (limit,)).fetchall()

    def seen_states(self, states: dict) -> None:
        """``seen`` for many jobs' states at once ({job id: state}), in one transaction (``ps``)."""
        with self.db:
            now = time.time()
            self.db.executemany("UPDATE jobs SET state = ?, seen_at = ? WHERE job_id = ?",
                                [(s, now, j) for j, s in states.items()])

    def seen(self, job_id: str, state: str | None, ledger: dict | None = None,
             target: str | None = None, name: str | None = None) -> None:
        """Remember the last state seen, and mirror the container's ledger."""
        with self.db:
            self.db.execute("UPDATE jobs SET state = ?, seen_at = ? WHERE job_id = ?",
                            (state, time.time(), job_id))
            for profile, e in ((ledger or {}).get("profiles") or {}).items():
                self.db.execute(
                    "INSERT OR REPLACE INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (target, name, profile, e.get("status"), e.get("baseline"), e.get("reason"),
                     e.get("at")))
